"""Checkpoint storage: atomic step directories, last K kept, plus ``best/``.

The names under ``<run_dir>/checkpoints`` and what a complete checkpoint is are
:mod:`pipeline.training.checkpoint_layout`'s (readers outside training import it without torch);
the files' content is this module's:

* ``meta.json``: ``{"step", "epoch", "world_size"}`` (for people; loads use the .pt files);
* ``model.json``: the FraudModelConfig, so export needs nothing else;
* ``trainer.pt``: rank 0's model + optimizer state and trainer counters (tensors/primitives only);
* ``rank-NNNNN.pt``: each rank's error-feedback residuals and RNG state;
* ``best/calibration.pt``: temperature and logit shift, added after training (see calibration.py),
  with a blend's booster (``best/gbm.*``, :mod:`models.gbm`) whose weight belongs to it.

A step directory is written as ``.tmp-step-NNNNNNNN/`` and published whole with
:func:`pipeline.atomic.publish_dir`; ``best/`` is a hard-link copy published the same way, and
finalisation's calibration and booster replace it whole again (:meth:`Checkpointer.save_calibrated`),
so a reader of ``best/`` (export, finalisation) finds the calibration with its own booster.
Everything is loaded with ``torch.load(weights_only=True)``: no pickled objects. A kill during a
save leaves only a dot-name directory (``.tmp-step-*``, ``.best.tmp-<pid>``), removed at the next
start; the latest complete checkpoint is untouched. Multi-node runs need the run directory on a shared filesystem.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from models.gbm import GBM_CONFIG_FILE, GBM_MODEL_FILE, GbmTerm, save_gbm_term
from pipeline.atomic import publish_dir, restore_interrupted_publish, staged_dir
from pipeline.training.checkpoint_layout import (
    BEST,
    CALIBRATION_FILE,
    META_FILE,
    MODEL_CONFIG_FILE,
    TRAINER_FILE,
    rank_file,
    step_checkpoints,
    step_dir_name,
)
from pipeline.training.run_dir import CheckpointError

# What finalisation writes into best/: each is written anew when best/ is republished, never linked.
_FINALISED_FILES = frozenset({CALIBRATION_FILE, GBM_CONFIG_FILE, GBM_MODEL_FILE})


def _save_tensor_file(obj: Any, path: Path) -> None:
    with path.open("wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())


def load_tensor_file(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"cannot read checkpoint file {path}: {exc}") from exc


class Checkpointer:
    """Saves and finds checkpoints of one run; every rank holds one and calls it collectively.

    ``barrier`` synchronises the ranks (``torch.distributed.barrier`` in a job, a no-op alone).
    """

    def __init__(self, directory: Path, rank: int, world_size: int, keep_last: int,
                 barrier: Callable[[], None]) -> None:
        self.directory = Path(directory)
        self.rank, self.world_size, self.keep_last = rank, world_size, keep_last
        self.barrier = barrier
        if rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._clean_interrupted()
        barrier()

    def _clean_interrupted(self) -> None:
        restore_interrupted_publish(self.best)  # killed mid-swap where names cannot be exchanged
        for tmp in self.directory.glob(".*"):
            shutil.rmtree(tmp, ignore_errors=True)

    @property
    def best(self) -> Path:
        return self.directory / BEST

    def step_dirs(self) -> list[Path]:
        return step_checkpoints(self.directory)

    def latest(self) -> Path | None:
        dirs = self.step_dirs()
        return dirs[-1] if dirs else None

    def save(self, step: int, epoch: int, trainer_state: dict[str, Any], rank_state: dict[str, Any],
             model_config_json: str, is_best: bool) -> Path:
        """Collective: rank 0 writes the shared state, each rank its own file; then the directory
        appears atomically (rename), becomes ``best/`` if ``is_best``, and old ones are pruned."""
        final = self.directory / step_dir_name(step)
        tmp = self.directory / f".tmp-{final.name}"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.barrier()
        _save_tensor_file(rank_state, tmp / rank_file(self.rank))
        if self.rank == 0:
            _save_tensor_file(trainer_state, tmp / TRAINER_FILE)
            (tmp / MODEL_CONFIG_FILE).write_text(model_config_json)
            meta = {"step": step, "epoch": epoch, "world_size": self.world_size}
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        self.barrier()  # every rank's file is on disk before the directory becomes visible
        if self.rank == 0:
            publish_dir(tmp, final)  # same step saved again after a resume: replaced whole
            if is_best:
                self.mark_best(final)
            self._prune()
        self.barrier()
        return final

    def mark_best(self, step_dir: Path) -> None:
        """Make ``best/`` a copy of ``step_dir`` (hard links; checkpoint files are never rewritten)."""
        with staged_dir(self.best) as tmp:
            shutil.copytree(step_dir, tmp, copy_function=os.link, dirs_exist_ok=True)

    def best_step(self) -> int | None:
        meta = self.best / META_FILE
        return json.loads(meta.read_text())["step"] if meta.is_file() else None

    def ensure_best(self, step: int | None) -> None:
        """Rank 0, after a resume: a kill between saving and marking best leaves best/ behind."""
        if self.rank != 0 or step is None or self.best_step() == step:
            return
        candidate = self.directory / step_dir_name(step)
        if candidate.is_dir():
            self.mark_best(candidate)

    def _prune(self) -> None:
        for old in self.step_dirs()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def load(self, step_dir: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(trainer state, this rank's state or None when the run had fewer ranks)."""
        trainer_state = load_tensor_file(step_dir / TRAINER_FILE)
        own = step_dir / rank_file(self.rank)
        return trainer_state, load_tensor_file(own) if own.is_file() else None

    def save_calibrated(self, temperature: float, logit_shift: float, gbm: GbmTerm | None) -> None:
        """Rank 0: publish ``best/`` again with the fitted calibration and a blend's booster (or
        none, dropping one a previous finalisation stored), in one replace of the directory: the
        booster's weight was fitted with this calibration and is never read with another."""
        with staged_dir(self.best) as tmp:
            shutil.copytree(self.best, tmp, copy_function=os.link, dirs_exist_ok=True,
                            ignore=lambda _, names: [n for n in names if n in _FINALISED_FILES])
            torch.save({"temperature": torch.tensor(temperature, dtype=torch.float64),
                        "logit_shift": torch.tensor(logit_shift, dtype=torch.float64)}, tmp / CALIBRATION_FILE)
            if gbm is not None:
                save_gbm_term(gbm, tmp)
