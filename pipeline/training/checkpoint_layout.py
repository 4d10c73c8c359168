"""Names inside ``<run_dir>/checkpoints/`` and what a complete checkpoint is: the one definition
that the Checkpointer (writer, :mod:`pipeline.training.checkpoint`) and the readers outside
training (the run directory, rollback, export) import. Imports no torch::

    step-00000200/            # one checkpoint (complete, or absent: see below)
      meta.json               # {"step", "epoch", "world_size"}
      model.json              # FraudModelConfig
      trainer.pt              # rank 0: model + optimizer state, trainer counters
      rank-00000.pt           # per rank: error-feedback residuals, RNG state
    best/                     # copy of the step directory with the best validation AP
      calibration.pt          # added after training

A checkpoint directory is built under a dot-name and published whole with
:func:`pipeline.atomic.publish_dir`, so a directory under a checkpoint name holds every file or
does not exist; :func:`is_checkpoint` tells one from any other directory by ``trainer.pt``, the
file every load reads.
"""

from __future__ import annotations

import re
from pathlib import Path

BEST = "best"
STEP_DIR = re.compile(r"^step-(\d{8})$")
META_FILE = "meta.json"
MODEL_CONFIG_FILE = "model.json"
TRAINER_FILE = "trainer.pt"
CALIBRATION_FILE = "calibration.pt"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint directory (a step directory or ``best/``)."""
    return (Path(path) / TRAINER_FILE).is_file()


def step_checkpoints(directory: Path) -> list[Path]:
    """The complete ``step-NNNNNNNN`` checkpoints in ``directory``, oldest step first."""
    found = (p for p in Path(directory).glob("step-*") if STEP_DIR.match(p.name) and is_checkpoint(p))
    return sorted(found, key=lambda p: p.name)
