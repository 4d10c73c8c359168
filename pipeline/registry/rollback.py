"""Undo a promotion: ``fraudctl rollback`` [``--to-version N`` | ``--from-checkpoint RUN_OR_PATH``].

* default: ``champion`` goes back to ``previous-champion`` (repeatable: walks back through history);
* ``--to-version N``: ``champion`` moves to registered version N;
* ``--from-checkpoint``: the model of a training checkpoint (a run's ``checkpoints/best`` or a
  ``step-*`` directory) is exported, logged and registered as a new version, then made champion.

A rollback never changes how payments are decided behind the operator's back: a version registered
from a checkpoint carries operating points like every trained version (:func:`checkpoint_operating_points`),
or the rollback is refused (:class:`CheckpointError`) and the champion stays.

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

from pipeline.decisions.operating_points import (
    OPERATING_POINTS_FILE,
    DecisionBudget,
    OperatingPoints,
    choose_operating_points,
    read_operating_points,
    write_operating_points,
)
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


def checkpoint_operating_points(ref: CheckpointRef, model_dir: Path) -> tuple[OperatingPoints, str]:
    """The operating points the model exported from ``ref`` into ``model_dir`` decides at, and where
    they come from (the ``operating_points.origin`` tag).

    * the run's own (``<run>/model/operating_points.json``) when ``model_dir`` holds the very model
      the run exported (its ``best`` checkpoint after finalisation: same weights, calibration and
      booster, byte for byte): they were chosen for these scores;
    * otherwise (a ``step-*`` checkpoint: other weights, not calibrated), chosen afresh as training's
      finalisation chooses them: :func:`choose_operating_points` with the run's ``[decisions]`` budget
      on this model's probabilities of the run's validation split.

    Raises :class:`CheckpointError`, saying what to do, when neither is possible (no run directory,
    or its dataset is gone): registering the model without them would decide payments at the
    serving config's fallback thresholds instead of the budget's.
    """
    if ref.run_dir is None:
        raise CheckpointError(
            f"{ref.checkpoint_dir} is not inside a training run (<run_dir>/checkpoints/), so nothing says at "
            "which thresholds its model should decide; pass the checkpoint inside its run directory, or roll "
            "back to a registered version with --to-version N")
    run = RunDir(ref.run_dir)
    shipped = read_operating_points(run.model) if run.model.is_dir() else None
    if shipped is not None and _same_files(model_dir, run.model, exclude={OPERATING_POINTS_FILE}):
        return shipped, "run-model"
    return _validation_operating_points(run, model_dir), "checkpoint-validation"


def _same_files(a: Path, b: Path, exclude: set[str]) -> bool:
    names = {p.name for p in a.iterdir()} - exclude
    return names == {p.name for p in b.iterdir()} - exclude and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names)


def _validation_operating_points(run: RunDir, model_dir: Path) -> OperatingPoints:
    # Imported here: torch and the dataset reader, for this path only.
    import numpy as np
    import torch

    from models.fraud_mlp import frame_to_tensors, load_model
    from pipeline.datasets.reader import read_split

    root = run.read_dataset_root() if run.dataset.is_file() else None
    if root is None or not root.is_dir():
        raise CheckpointError(
            f"{run.path}'s dataset ({root or 'not recorded'}) is not available, and this checkpoint is not the "
            "model the run exported, so its operating points cannot be chosen on the validation split; restore "
            "the dataset, pass the run's checkpoints/best, or roll back to a registered version with --to-version N")
    try:
        budget = DecisionBudget(**run.read_config().get("decisions", {}))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{run.config}: its [decisions] budget is unreadable ({exc})") from exc
    manifest = run.read_dataset()
    validation = read_split(root, manifest, "validation")
    if validation.empty:
        raise CheckpointError(f"{run.path}'s dataset has no validation rows to choose operating points on; "
                              "roll back to a registered version with --to-version N")
    model = load_model(model_dir)
    # Columns by the model's own feature names, as every scorer feeds it (never the manifest's order).
    numeric, categorical = frame_to_tensors(validation, model.config)
    with torch.inference_mode():
        scores = model.predict_proba(numeric, categorical).numpy().astype(np.float64)
    return choose_operating_points(validation[manifest.label_column].to_numpy(), scores, budget)


def register_checkpoint(config: RegistryConfig, client: MlflowClient, ref: CheckpointRef) -> int:
    """Export the checkpoint's model with its operating points (:func:`checkpoint_operating_points`),
    log it as a new MLflow run and register it; returns the version."""
    # Imported here: only this path needs the training package's torch side (the checkpoint format).
    from pipeline.training.export import export_model_from_checkpoint

    tags = _checkpoint_tags(ref)
    run = RunDir(ref.run_dir) if ref.run_dir is not None else None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            model_dir = export_model_from_checkpoint(ref.checkpoint_dir, Path(tmp) / "model")
        except (OSError, RuntimeError, KeyError) as exc:  # CheckpointError is a RuntimeError
            raise CheckpointError(f"cannot export a model from {ref.checkpoint_dir}: {exc}") from exc
        points, origin = checkpoint_operating_points(ref, model_dir)
        write_operating_points(model_dir, points)
        version_tags = {**tags, **points.tags(), "operating_points.origin": origin}
        run_name = f"rollback-{run.name if run else ref.checkpoint_dir.parent.name}-{ref.checkpoint_dir.name}"
        with mlflow.start_run(experiment_id=ensure_experiment(client, config), run_name=run_name, tags=tags):
            if run is not None and run.dataset.is_file():
                log_training_dataset(run.read_dataset(), run.read_dataset_root() or run.dataset)
            info = log_pyfunc_model(model_dir)
        return register_version(config.model_name, info.model_uri, version_tags)


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
