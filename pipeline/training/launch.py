"""Launch the training job under torchrun (single node) and read back its summary.

``torchrun`` runs one ``jobs/train.py`` process per rank with an elastic agent that restarts the
whole group (up to ``max_restarts``) when a worker dies, whatever the cause; workers then resume
from the latest checkpoint. Restarts are for failures a new attempt can survive (a killed worker,
a lost peer), so what no attempt can survive (config, dataset, batch geometry: see
:mod:`pipeline.training.preflight`) is checked here first and launches nothing. The rendezvous is
c10d on 127.0.0.1 port 0: the agent binds a free port itself.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pipeline.config import PROJECT_ROOT
from pipeline.paths import state_dir
from pipeline.training import run_dir as files

JOB_SCRIPT = PROJECT_ROOT / "jobs" / "train.py"


class TrainingJobFailed(RuntimeError):
    """The torchrun job exited non-zero or left no summary."""


class TrainingCannotStart(TrainingJobFailed):
    """The config or the dataset rule the job out; nothing was launched (retrying cannot help)."""


def default_run_name() -> str:
    return f"train-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}"


def default_run_dir(run_name: str) -> Path:
    return state_dir() / "runs" / run_name


def torchrun_command(nproc: int, max_restarts: int, job_args: list[str], run_id: str) -> list[str]:
    """The command line: ``python -m torch.distributed.run ... jobs/train.py <job_args>``."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes=1", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
        "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", f"--rdzv-id={run_id}",
        str(JOB_SCRIPT), *job_args,
    ]


def job_arguments(run_dir: Path, env: str | None, config_path: Path | None, dataset_root: Path | None,
                  resume: bool) -> list[str]:
    args = ["--run-dir", str(run_dir)]
    if env:
        args += ["--env", env]
    if config_path:
        args += ["--config", str(config_path)]
    if dataset_root:
        args += ["--dataset-root", str(dataset_root)]
    if not resume:
        args.append("--no-resume")
    return args


def check_before_launch(config_env: str | None, config_path: Path | None, dataset_root: Path | None,
                        nproc: int) -> None:
    """The preflight of :mod:`pipeline.training.preflight` on the config and dataset the workers
    will read (same environment, same resolution); :class:`TrainingCannotStart` if it fails."""
    # Imported here: it loads torch, which the other fraudctl commands importing this module never need.
    from pipeline.training.config import load_train_config
    from pipeline.training.preflight import CANNOT_START_ERRORS, check_startable, resolve_dataset_root

    try:
        config = load_train_config(config_env, config_path)
        check_startable(config, resolve_dataset_root(config, dataset_root), nproc)
    except CANNOT_START_ERRORS as exc:
        raise TrainingCannotStart(f"training not started: {type(exc).__name__}: {exc}") from exc


def run_training(config_env: str | None = "dev", run_dir: Path | None = None, dataset_root: Path | None = None,
                 nproc: int = 2, max_restarts: int = 0, resume: bool = True, config_path: Path | None = None,
                 capture_output: bool = False, timeout_s: float | None = None) -> dict[str, Any]:
    """Train with ``nproc`` processes and return ``summary.json`` as a dict.

    Output streams to this process's stdout/stderr (rank 0's live progress) unless
    ``capture_output``; then it is kept and attached to the error on failure.
    Raises :class:`TrainingCannotStart` (before creating the run directory or starting torchrun)
    when the preflight checks fail, else :class:`TrainingJobFailed` with the job's exit code and
    the tail of its output.
    """
    if nproc < 1:
        raise ValueError("nproc must be >= 1")
    check_before_launch(config_env, config_path, dataset_root, nproc)
    run_dir = Path(run_dir) if run_dir else default_run_dir(default_run_name())
    run_dir.mkdir(parents=True, exist_ok=True)
    command = torchrun_command(nproc, max_restarts, job_arguments(run_dir, config_env, config_path, dataset_root,
                                                                  resume), run_id=run_dir.name)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(command, cwd=PROJECT_ROOT, env=env, timeout=timeout_s, text=True,
                          capture_output=capture_output)
    output = (proc.stdout or "") + (proc.stderr or "")
    summary = files.read_summary(run_dir)
    if proc.returncode != 0 or summary is None:
        reasons = [line for line in output.splitlines() if "training failed:" in line]
        detail = reasons[-1] if reasons else output[-3000:]
        raise TrainingJobFailed(
            f"training job in {run_dir} exited with code {proc.returncode}"
            + (" without writing summary.json" if summary is None else "") + (f": {detail}" if detail else ""))
    summary["output"] = output if capture_output else None
    return summary
