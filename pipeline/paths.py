"""Project-local state directory: broker pidfile and log, raw store, datasets, MLflow store.

Defaults to ``<project>/.state``; ``$FRAUD_STATE_DIR`` moves it (tests point it at a tmp dir).
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.config import PROJECT_ROOT

ENV_VAR_STATE_DIR = "FRAUD_STATE_DIR"


def state_dir() -> Path:
    """The state directory, created if missing."""
    path = Path(os.environ.get(ENV_VAR_STATE_DIR) or PROJECT_ROOT / ".state")
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve_state_path(path: str | Path) -> Path:
    """A config path: absolute as given, relative ones under :func:`state_dir`."""
    p = Path(path)
    return p if p.is_absolute() else state_dir() / p
