"""A version registered from a checkpoint decides at operating points, as every trained version does:
``fraudctl rollback --from-checkpoint`` must never put a model live at serving's fallback thresholds."""

from __future__ import annotations

import pytest

from pipeline.datasets.reader import read_split
from pipeline.decisions.operating_points import (
    DecisionBudget,
    choose_operating_points,
    operating_points_from_tags,
    read_operating_points,
)
from pipeline.registry.errors import CheckpointError
from pipeline.registry.rollback import rollback_from_checkpoint
from pipeline.registry.store import CHAMPION, connect, version_by_alias
from pipeline.registry.tracking import register_run
from pipeline.serving.model_source import RegistryModelSource
from pipeline.training.run_dir import RunDir
from tests.registry import factory


def served_points(config, version: int):
    """The operating points the scoring service reads with the version's model."""
    return RegistryModelSource(config).fetch(version).operating_points


def test_the_best_checkpoint_carries_the_runs_operating_points(world, config):
    # best/ after finalisation is the model the run exported: the run's thresholds are this model's.
    run_dir = world.run_dir(f"{config.model_name}-best", world.weak)
    factory.write_checkpoint(run_dir, world.weak, step=120)
    shipped = read_operating_points(RunDir(run_dir).model)
    assert shipped is not None

    version = rollback_from_checkpoint(config, str(run_dir), actor="dave").to_version

    assert served_points(config, version) == shipped
    tags = version_tags(config, version)
    assert operating_points_from_tags(tags) == shipped
    assert tags["operating_points.origin"] == "run-model"


def test_a_step_checkpoint_gets_thresholds_chosen_for_its_own_scores(world, config):
    # Other weights than the run's model: the run's thresholds belong to another score distribution.
    run_dir = world.run_dir(f"{config.model_name}-step", world.weak)
    step = factory.write_checkpoint(run_dir, world.good, step=40)
    register_run(run_dir, config)  # a champion-to-be: something to roll back from

    version = rollback_from_checkpoint(config, str(step), actor="erin").to_version

    validation = read_split(world.root, world.manifest, "validation")
    expected = choose_operating_points(validation["label"].to_numpy(), factory.score(world.good, validation),
                                       DecisionBudget())
    points = served_points(config, version)
    assert points is not None and points != read_operating_points(RunDir(run_dir).model)
    assert points.review_threshold == pytest.approx(expected.review_threshold, rel=1e-5)
    assert points.block_threshold == pytest.approx(expected.block_threshold, rel=1e-5)
    assert version_tags(config, version)["operating_points.origin"] == "checkpoint-validation"


def test_a_checkpoint_whose_thresholds_cannot_be_known_is_refused(world, config, client, tmp_path):
    # A directory with checkpoints but no run inputs (no dataset to choose on, no exported model to
    # match): refused, nothing registered, the champion stays.
    champion = register_run(world.run_dir(f"{config.model_name}-alone", world.weak), config)
    promote(client, config, champion)
    lone = factory.write_checkpoint(tmp_path / "copied-checkpoints", world.good, step=7)
    versions = len(client.search_model_versions(f"name='{config.model_name}'"))
    with pytest.raises(CheckpointError, match="dataset .* is not available.*--to-version N"):
        rollback_from_checkpoint(config, str(lone), actor="frank")
    assert int(version_by_alias(client, config.model_name, CHAMPION).version) == champion
    assert len(client.search_model_versions(f"name='{config.model_name}'")) == versions


def promote(client, config, version: int) -> None:
    client.set_registered_model_alias(config.model_name, CHAMPION, str(version))


def version_tags(config, version: int) -> dict[str, str]:
    return connect(config).get_model_version(config.model_name, str(version)).tags


