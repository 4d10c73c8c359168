"""Undo a promotion: ``fraudctl rollback`` [``--to-version N`` | ``--from-checkpoint RUN_OR_PATH``].

* default: ``champion`` goes back to ``previous-champion`` (repeatable: walks back through history);
* ``--to-version N``: ``champion`` moves to registered version N;
* ``--from-checkpoint``: the model of a training checkpoint (a run's ``checkpoints/best`` or a
  ``step-*`` directory) is exported, logged and registered as a new version, then made champion.

The target is loaded before any alias moves, so a missing or corrupt artifact leaves the champion
untouched. Every rollback appends an audit record. Alias moves happen under the registry lock.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from pipeline.registry import audit
from pipeline.registry.aliases import advance_champion, current_champion, previous_champion, revert_champion
from pipeline.registry.config import RegistryConfig
from pipeline.registry.errors import CheckpointError, NoChampion, RegistryError
from pipeline.registry.lock import registry_lock
from pipeline.registry.model_package import log_pyfunc_model, register_version
from pipeline.registry.scoring import load_scorer
from pipeline.registry.store import connect, ensure_experiment, version_uri
from pipeline.registry.tracking import code_lineage_tags, dataset_lineage_tags, log_training_dataset
from pipeline.training.checkpoint_layout import is_checkpoint
from pipeline.training.run_dir import RunDir, runs_root


@dataclass(frozen=True)
class CheckpointRef:
    checkpoint_dir: Path
    run_dir: Path | None  # the run it belongs to, when it sits in <run_dir>/checkpoints/


def rollback(config: RegistryConfig, to_version: int | None = None, actor: str | None = None,
             reason: str | None = None) -> audit.AuditRecord:
    """Move ``champion`` to ``previous-champion`` (or to ``to_version``); returns the audit record."""
    client = connect(config)
    name = config.model_name
    with registry_lock(config):
        champion = current_champion(client, name)
        if to_version is None:
            target = previous_champion(client, name)
            if champion is None or target is None or target == champion:
                raise NoChampion(
                    f"{name!r} has no previous champion to roll back to (champion: {champion or 'none'}); "
                    "pick a version from `fraudctl history` and use --to-version N"
                )
            _check_loadable(name, target)
            revert_champion(client, name, target)
            action = audit.ROLLBACK
        else:
            target = to_version
            _check_version_exists(client, name, target)
            if target == champion:
                raise RegistryError(f"version {target} of {name!r} is already champion; nothing changed")
            _check_loadable(name, target)
            advance_champion(client, name, target, champion)
            action = audit.ROLLBACK_TO_VERSION
        record = audit.new_record(action, audit.resolve_actor(actor), champion, target,
                                  reason or f"operator rollback from v{champion} to v{target}")
        audit.append_record(client, name, record)
        return record


def _check_version_exists(client: MlflowClient, name: str, version: int) -> None:
    try:
        client.get_model_version(name, str(version))
    except MlflowException as exc:
        raise RegistryError(f"{name!r} has no version {version}; see `fraudctl history`") from exc


def _check_loadable(name: str, version: int) -> None:
    """Raise ModelLoadError now, before any alias moves, if the version's artifacts are unusable."""
    load_scorer(version_uri(name, version))


def resolve_checkpoint(ref: str) -> CheckpointRef:
    """A checkpoint directory, a run directory (-> its best, else latest, checkpoint) or a run name."""
    path = Path(ref)
    run = RunDir(path) if path.exists() else RunDir.named(ref)
    if is_checkpoint(run.path):
        owner = RunDir.of_checkpoint(run.path)
        return CheckpointRef(run.path.resolve(), owner.path.resolve() if owner else None)
    checkpoint = run.find_checkpoint()
    if checkpoint is not None:
        return CheckpointRef(checkpoint.resolve(), run.path.resolve())
    raise CheckpointError(
        f"{ref!r} is neither a checkpoint directory, a run directory with checkpoints, nor a run name under "
        f"{runs_root()}; pass e.g. <run_dir>/checkpoints/best"
    )


def _checkpoint_tags(ref: CheckpointRef) -> dict[str, str]:
    tags = {"source": "checkpoint", "checkpoint.path": str(ref.checkpoint_dir)}
    if ref.run_dir is not None:
        run = RunDir(ref.run_dir)
        tags["training.run_dir"] = str(run.path)
        if run.dataset.is_file():
            tags.update(dataset_lineage_tags(run.read_dataset(), run.read_dataset_root()))
    return {**tags, **code_lineage_tags({})}


def register_checkpoint(config: RegistryConfig, client: MlflowClient, ref: CheckpointRef) -> int:
    """Export the checkpoint's model, log it as a new MLflow run and register it; returns the version."""
    # Imported here: only this path needs the training package's torch side (the checkpoint format).
    from pipeline.training.export import export_model_from_checkpoint

    tags = _checkpoint_tags(ref)
    run = RunDir(ref.run_dir) if ref.run_dir is not None else None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            model_dir = export_model_from_checkpoint(ref.checkpoint_dir, Path(tmp) / "model")
        except (OSError, RuntimeError, KeyError) as exc:  # CheckpointError is a RuntimeError
            raise CheckpointError(f"cannot export a model from {ref.checkpoint_dir}: {exc}") from exc
        run_name = f"rollback-{run.name if run else ref.checkpoint_dir.parent.name}-{ref.checkpoint_dir.name}"
        with mlflow.start_run(experiment_id=ensure_experiment(client, config), run_name=run_name, tags=tags):
            if run is not None and run.dataset.is_file():
                log_training_dataset(run.read_dataset(), run.read_dataset_root() or run.dataset)
            info = log_pyfunc_model(model_dir)
        return register_version(config.model_name, info.model_uri, tags)


def rollback_from_checkpoint(config: RegistryConfig, ref: str, actor: str | None = None,
                             reason: str | None = None) -> audit.AuditRecord:
    """Register the model of checkpoint ``ref`` as a new version and make it champion."""
    checkpoint = resolve_checkpoint(ref)
    client = connect(config)
    version = register_checkpoint(config, client, checkpoint)
    name = config.model_name
    _check_loadable(name, version)
    with registry_lock(config):
        champion = current_champion(client, name)
        advance_champion(client, name, version, champion)
        record = audit.new_record(
            audit.ROLLBACK_FROM_CHECKPOINT, audit.resolve_actor(actor), champion, version,
            reason or f"operator rollback to checkpoint {checkpoint.checkpoint_dir}",
        )
        audit.append_record(client, name, record)
        return record
