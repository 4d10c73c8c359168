"""Validation of the [compression] options that correct top-k under AdamW."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError
from pipeline.training.config import load_train_config, train_config_from_dict
from tests.training.dataset_factory import train_config_dict


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_checked_in_configs_can_turn_every_correction_on(env):
    # Off by default until the full-size compression bench shows a gain; switching them on must then be
    # the only edit needed (the env's method and dense warm-up must allow them).
    from pipeline.training.config import derive_train_config

    on = {"freeze_variance": True, "local_clipping": True, "select_by_update": True}
    assert not any(getattr(load_train_config(env).compression, key) for key in on)
    compression = train_config_from_dict(derive_train_config(env, {"compression": on})).compression
    assert compression.freeze_variance and compression.local_clipping and compression.select_by_update


OFF = {"freeze_variance": False, "local_clipping": False, "select_by_update": False}


@pytest.mark.parametrize(("overrides", "named"), [
    ({"method": "allreduce", "freeze_variance": True}, "compression.freeze_variance"),
    ({"method": "topk_ef", "freeze_variance": True, "dense_warmup_steps": 0}, "dense_warmup_steps >= 1"),
    ({"method": "topk", "local_clipping": True}, "compression.local_clipping"),
    ({"method": "fp16", "local_clipping": True}, "compression.local_clipping"),
    ({"method": "topk_ef", "select_by_update": True}, "compression.select_by_update"),
])
def test_a_correction_where_it_cannot_apply_is_rejected_with_its_name(overrides, named):
    with pytest.raises(ConfigError, match=named):
        train_config_from_dict(train_config_dict({"compression": {**OFF, **overrides}}))


def test_the_corrections_are_accepted_where_they_apply():
    config = train_config_from_dict(train_config_dict({"compression": {
        "method": "topk", "freeze_variance": True, "local_clipping": False, "dense_warmup_steps": 1}}))
    assert config.compression.freeze_variance
    config = train_config_from_dict(train_config_dict({"compression": {
        "method": "topk_ef", "freeze_variance": True, "local_clipping": True, "select_by_update": True}}))
    assert config.compression.local_clipping and config.compression.select_by_update
