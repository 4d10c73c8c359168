"""Rollback (to the previous champion, to a version, from a training checkpoint) and the audit history."""

from __future__ import annotations

from dataclasses import replace

import mlflow
import numpy as np
import pytest

from pipeline.datasets.reader import read_split
from pipeline.evaluation.report import PROMOTED
from pipeline.registry.audit import read_history
from pipeline.registry.errors import CheckpointError, ModelLoadError, NoChampion, RegistryError
from pipeline.registry.promotion import run_gate
from pipeline.registry.rollback import resolve_checkpoint, rollback, rollback_from_checkpoint
from pipeline.registry.store import CHAMPION, PREVIOUS_CHAMPION, version_by_alias
from pipeline.registry.tracking import register_run
from tests.registry import factory
from tests.registry.conftest import version_artifact_dir


def alias(client, config, name) -> int | None:
    version = version_by_alias(client, config.model_name, name)
    return int(version.version) if version else None


def promote_chain(world, config, models) -> list[int]:
    """Register and gate each model in turn; each must be promoted (each beats or equals the last)."""
    versions = []
    for i, model in enumerate(models):
        versions.append(register_run(world.run_dir(f"{config.model_name}-{i}", model), config))
        assert run_gate(config, actor="nightly-dag").outcome == PROMOTED
    return versions


@pytest.fixture
def chain(world, config):
    """Three promotions: weak -> good -> good recalibrated (same AUC), for walking back through history."""
    lenient = replace(config, gate=replace(config.gate, ece_limit=replace(config.gate.ece_limit, value=1.0)))
    return lenient, promote_chain(world, lenient, [world.weak, world.good, factory.with_temperature(world.good, 0.9)])


def test_rollback_walks_back_through_previous_champions(chain, client):
    config, (v1, v2, v3) = chain
    assert (alias(client, config, CHAMPION), alias(client, config, PREVIOUS_CHAMPION)) == (v3, v2)
    record = rollback(config, actor="alice", reason="alert storm after release")
    assert (record.action, record.from_version, record.to_version) == ("rollback", v3, v2)
    assert (alias(client, config, CHAMPION), alias(client, config, PREVIOUS_CHAMPION)) == (v2, v1)
    rollback(config, actor="alice")
    assert (alias(client, config, CHAMPION), alias(client, config, PREVIOUS_CHAMPION)) == (v1, None)
    with pytest.raises(NoChampion, match="--to-version"):
        rollback(config)
    assert alias(client, config, CHAMPION) == v1


def test_rollback_to_a_chosen_version(chain, client):
    config, (v1, v2, v3) = chain
    record = rollback(config, to_version=v1, actor="bob", reason="v2 and v3 share a feature bug")
    assert (record.action, record.from_version, record.to_version) == ("rollback-to-version", v3, v1)
    assert (alias(client, config, CHAMPION), alias(client, config, PREVIOUS_CHAMPION)) == (v1, v3)
    with pytest.raises(RegistryError, match="no version 99"):
        rollback(config, to_version=99)
    with pytest.raises(RegistryError, match="already champion"):
        rollback(config, to_version=v1)
    assert alias(client, config, CHAMPION) == v1


def test_rollback_to_a_corrupt_version_leaves_champion_untouched(chain, client):
    config, (v1, v2, v3) = chain
    next(version_artifact_dir(client, config.model_name, v2).rglob("model.json")).write_text("{broken")
    with pytest.raises(ModelLoadError):
        rollback(config)
    assert (alias(client, config, CHAMPION), alias(client, config, PREVIOUS_CHAMPION)) == (v3, v2)
    assert [r.action for r in read_history(client, config.model_name)] == ["promote"] * 3


def test_audit_history_records_time_actor_versions_and_reason(chain, client):
    config, (v1, v2, v3) = chain
    rollback(config, actor="carol", reason="precision dropped in the dashboard")
    history = read_history(client, config.model_name)
    assert [(r.action, r.actor, r.from_version, r.to_version) for r in history] == [
        ("promote", "nightly-dag", None, v1), ("promote", "nightly-dag", v1, v2),
        ("promote", "nightly-dag", v2, v3), ("rollback", "carol", v3, v2)]
    assert history[-1].reason == "precision dropped in the dashboard"
    assert history[1].reason.startswith("gate: ") and "AUC-ROC" in history[1].reason
    assert all(r.time.endswith("+00:00") for r in history)


def test_rollback_from_a_training_checkpoint_registers_it_as_champion(world, config, client):
    champion = promote_chain(world, config, [world.good])[0]
    run_dir = world.run_dir(f"{config.model_name}-ckpt", world.weak)
    factory.write_checkpoint(run_dir, world.weak, step=120)
    record = rollback_from_checkpoint(config, str(run_dir), actor="dave")
    assert (record.action, record.from_version) == ("rollback-from-checkpoint", champion)
    new = record.to_version
    assert (alias(client, config, CHAMPION), alias(client, config, PREVIOUS_CHAMPION)) == (new, champion)
    version = client.get_model_version(config.model_name, str(new))
    assert version.tags["checkpoint.path"] == str(run_dir.resolve() / "checkpoints" / "best")
    assert version.tags["dataset.content_hash"] == world.manifest.content_hash
    inputs = client.get_run(version.run_id).inputs.dataset_inputs
    assert [(i.dataset.name, i.dataset.digest) for i in inputs] == [
        (world.manifest.version, world.manifest.content_hash[:36])]
    frame = read_split(world.root, world.manifest, "test")
    scored = mlflow.pyfunc.load_model(f"models:/{config.model_name}@{CHAMPION}").predict(frame)
    np.testing.assert_allclose(scored, factory.score(world.weak, frame), rtol=1e-6)


def test_checkpoint_references_resolve_by_run_name_run_dir_or_checkpoint_dir(world, config):
    run_dir = world.state / "runs" / "nightly-2024-03-08"
    step_dir = factory.write_checkpoint(run_dir, world.good, step=40)
    best = (run_dir / "checkpoints" / "best").resolve()
    assert resolve_checkpoint("nightly-2024-03-08").checkpoint_dir == best
    assert resolve_checkpoint(str(run_dir)).checkpoint_dir == best
    ref = resolve_checkpoint(str(step_dir))
    assert (ref.checkpoint_dir, ref.run_dir) == (step_dir.resolve(), run_dir.resolve())
    with pytest.raises(CheckpointError, match="neither a checkpoint"):
        resolve_checkpoint("no-such-run")
