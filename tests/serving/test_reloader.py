"""Following the alias on a real registry: promotions and rollbacks go live, bad versions never do."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.registry.aliases import advance_champion
from pipeline.registry.rollback import rollback
from pipeline.registry.store import CHAMPION
from pipeline.serving.config import DecisionConfig, ModelConfig
from pipeline.serving.errors import ServingError
from pipeline.serving.features import warmup_rows
from pipeline.serving.model_source import RegistryModelSource
from pipeline.serving.reloader import ModelReloader
from tests.registry.conftest import version_artifact_dir
from tests.serving import factory

FAST = ModelConfig(poll_interval_s=0.05, warmup_rows=4)


def reloader(config, model_config: ModelConfig = FAST, decision: DecisionConfig | None = None) -> ModelReloader:
    return ModelReloader(RegistryModelSource(config), CHAMPION, model_config, warmup_rows(factory.PARAMS, 4),
                         decision or DecisionConfig())


def test_a_promotion_goes_live_on_the_next_sync(config, client, logged, champion, models):
    r = reloader(config)
    assert r.sync() and r.active.version == champion
    assert not r.sync()  # same version: nothing to do
    new = factory.register(config, logged.other)
    advance_champion(client, config.model_name, new, champion)
    old = r.active
    assert r.sync() and r.active.version == new
    # The model object a request took before the swap still scores (requests in flight finish on it).
    row = warmup_rows(factory.PARAMS, 1)[0]
    assert old.scorer.score(row).score == pytest.approx(factory.score_row(models.good, row), rel=1e-6)
    assert r.active.scorer.score(row).score == pytest.approx(factory.score_row(models.other, row), rel=1e-6)


def test_a_rollback_reaches_the_service(config, client, logged, champion):
    r = reloader(config)
    r.sync()
    new = factory.register(config, logged.other)
    advance_champion(client, config.model_name, new, champion)
    r.sync()
    rollback(config, actor="test", reason="bad night")
    assert r.sync() and r.active.version == champion


@pytest.mark.parametrize(("bad", "message"), [("stale", "feature schema"), ("broken", "outside [0, 1]")])
def test_a_version_that_cannot_serve_leaves_the_live_one_serving(config, client, logged, champion, bad, message):
    r = reloader(config)
    r.sync()
    version = factory.register(config, getattr(logged, bad))
    client.set_registered_model_alias(config.model_name, CHAMPION, str(version))
    assert not r.sync()
    assert r.active.version == champion
    assert r.last_error.version == version and message in r.last_error.message
    assert r.loads == {"success": 1, "failure": 1}


def test_a_failed_version_is_retried_with_back_off_and_on_force(config, client, logged, champion):
    r = reloader(config, replace(FAST, poll_interval_s=60.0))
    r.sync()
    version = factory.register(config, logged.stale)
    client.set_registered_model_alias(config.model_name, CHAMPION, str(version))
    r.sync()
    r.sync()  # inside the back-off: not fetched again
    assert r.loads["failure"] == 1
    r.sync(force=True)
    assert r.loads["failure"] == 2 and r.active.version == champion


def test_corrupt_artifacts_are_a_load_error_not_a_crash(config, client, models, champion):
    uri = factory.log_model(config, models.other)  # its own log: this test damages the files
    version = factory.register(config, uri)
    weights = next(version_artifact_dir(client, config.model_name, version).rglob("model.safetensors"))
    weights.write_bytes(b"not a safetensors file")
    r = reloader(config)
    r.sync()
    client.set_registered_model_alias(config.model_name, CHAMPION, str(version))
    assert not r.sync()
    assert r.active.version == champion and "corrupt" in r.last_error.message


def test_pin_and_unpin(config, client, logged, champion):
    r = reloader(config)
    r.sync()
    other = factory.register(config, logged.other)
    r.pin(other)
    assert not r.sync() and r.active.version == other  # the alias still names the champion: pinned wins
    with pytest.raises(ServingError, match="feature schema"):
        r.pin(factory.register(config, logged.stale))
    assert r.active.version == other and r.pinned == other
    r.pin(None)
    assert r.active.version == champion and r.pinned is None


def test_no_champion_means_nothing_live_and_no_error(config, logged):
    r = reloader(config)
    factory.register(config, logged.good)  # a registered model without a champion
    assert not r.sync()
    assert r.active is None and r.last_error is None

