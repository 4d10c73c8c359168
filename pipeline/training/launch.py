"""Launch the training job under torchrun and read back its summary.

:func:`train_pinned` is how the pipeline's stages train (the nightly train stage, the backtest,
the benchmarks): pin one dataset version in a train.toml, reuse the run if it finished, else
launch torchrun. :func:`run_training` is the launch itself (``fraudctl train`` calls it directly).

``torchrun`` runs one ``jobs/train.py`` process per rank with an elastic agent that restarts the
whole group (up to ``max_restarts``) when a worker dies, whatever the cause; workers then resume
from the latest checkpoint. Restarts are for failures a new attempt can survive (a killed worker,
a lost peer), so what no attempt can survive (config, dataset, batch geometry: see
:mod:`pipeline.training.preflight`) is checked here first and launches nothing.

Rendezvous is c10d. On one node it binds 127.0.0.1 port 0 (the agent picks a free port); on
``nnodes`` > 1 the same command runs on every node with the same ``rdzv_endpoint`` (host:port of
node 0, reachable from the others) and run directory (shared storage). Node 0's agent hosts
the rendezvous, so the job survives the loss of any other node: its agent, started again by the
scheduler, rejoins, the group restarts (one of ``max_restarts`` on the surviving nodes) and
resumes from the latest checkpoint; losing node 0 ends the job (start it again to resume).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import PROJECT_ROOT, ConfigError
from pipeline.training.run_dir import RunDir, RunSummary

JOB_SCRIPT = PROJECT_ROOT / "jobs" / "train.py"
LOCAL_RENDEZVOUS = "127.0.0.1:0"  # loopback, port 0: the elastic agent binds a free port itself
FAILURE_MARKER = "training failed:"  # jobs/train.py's one-line reason, picked out of the output


class TrainingJobFailed(RuntimeError):
    """The torchrun job exited non-zero or left no summary."""


class TrainingCannotStart(TrainingJobFailed):
    """The config or the dataset rule the job out; nothing was launched (retrying cannot help)."""


@dataclass(frozen=True)
class Torchrun:
    """How torchrun starts the ranks: ``fraudctl train``'s options, or ``[train]`` of conf/<env>/nightly.toml."""

    nproc_per_node: int = 2  # ranks on this node (one per GPU on CUDA)
    nnodes: int = 1  # > 1: start the same command on every node (a PyTorchJob, a Slurm step, ...)
    rdzv_endpoint: str = ""  # host:port of the c10d rendezvous on node 0; "" = single node on loopback
    max_restarts: int = 0  # group restarts after a worker dies (each resumes from the last checkpoint)

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1 or self.nnodes < 1 or self.max_restarts < 0:
            raise ConfigError(f"torchrun: nproc_per_node and nnodes must be >= 1 and max_restarts >= 0, got {self}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ConfigError(f"torchrun: nnodes = {self.nnodes} needs rdzv_endpoint = \"<node 0 host>:<port>\" "
                              "(every node must reach the same rendezvous)")


def default_run_name() -> str:
    return f"train-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}"


def torchrun_command(torchrun: Torchrun, job_args: list[str], run_id: str) -> list[str]:
    """The command line: ``python -m torch.distributed.run ... jobs/train.py <job_args>``."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={torchrun.nnodes}", f"--nproc-per-node={torchrun.nproc_per_node}",
        f"--max-restarts={torchrun.max_restarts}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={torchrun.rdzv_endpoint or LOCAL_RENDEZVOUS}", f"--rdzv-id={run_id}",
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
                        world_size: int) -> None:
    """The preflight of :mod:`pipeline.training.preflight` on the config and dataset the workers
    will read (same environment, same resolution); :class:`TrainingCannotStart` if it fails."""
    # Imported here: it loads torch, which the other fraudctl commands importing this module never need.
    from pipeline.training.config import load_train_config
    from pipeline.training.preflight import CANNOT_START_ERRORS, check_startable, resolve_dataset_root

    try:
        config = load_train_config(config_env, config_path)
        check_startable(config, resolve_dataset_root(config, dataset_root), world_size)
    except CANNOT_START_ERRORS as exc:
        raise TrainingCannotStart(f"training not started: {type(exc).__name__}: {exc}") from exc


def agent_command(torchrun: Torchrun, run_dir: Path, config_env: str | None = None, config_path: Path | None = None,
                  dataset_root: Path | None = None, resume: bool = True) -> list[str]:
    """One torchrun agent's command line, the same on every node (the rendezvous id is the run's name)."""
    return torchrun_command(torchrun, job_arguments(run_dir, config_env, config_path, dataset_root, resume),
                            run_id=run_dir.name)


def agent_environment(torchrun: Torchrun) -> dict[str, str]:
    """This process's environment for a torchrun agent: one OpenMP thread per rank unless set, and
    on several nodes a new worker store every restart round, so that a node restarted after a
    failure can rejoin the others (see :mod:`pipeline.training.distributed`)."""
    # Imported here: it loads torch, which the other fraudctl commands importing this module never need.
    from pipeline.training.distributed import PER_ROUND_STORE_ENV

    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if torchrun.nnodes > 1:
        env[PER_ROUND_STORE_ENV] = "1"
    return env


def run_training(config_env: str | None, run_dir: Path, dataset_root: Path | None = None,
                 torchrun: Torchrun | None = None, resume: bool = True, config_path: Path | None = None,
                 log_file: Path | None = None, timeout_s: float | None = None) -> RunSummary:
    """Train under torchrun and return the run's ``summary.json``.

    ``torchrun`` defaults to 2 processes on this node, no restarts; with ``nnodes`` > 1 this is one
    node's agent, and every node calls it with the same arguments and a shared ``run_dir``. The job reads
    ``conf/<config_env>/train.toml``, or ``config_path`` when given. Its output
    streams to this process's stdout/stderr (rank 0's live progress), or into ``log_file`` when
    given (created or appended to). Raises :class:`TrainingCannotStart` (before creating the run
    directory or starting torchrun) when the preflight checks fail, else
    :class:`TrainingJobFailed` with the job's exit code and its one-line reason (or the tail of
    its output).
    """
    torchrun = torchrun or Torchrun()
    check_before_launch(config_env, config_path, dataset_root, torchrun.nproc_per_node * torchrun.nnodes)
    run = RunDir(run_dir)
    run.path.mkdir(parents=True, exist_ok=True)
    command = agent_command(torchrun, run.path, config_env, config_path, dataset_root, resume)
    env = agent_environment(torchrun)
    if log_file is None:
        proc = subprocess.run(command, cwd=PROJECT_ROOT, env=env, timeout=timeout_s)
        output = ""
    else:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("a") as log:
            start = log.tell()
            proc = subprocess.run(command, cwd=PROJECT_ROOT, env=env, timeout=timeout_s, stdout=log,
                                  stderr=subprocess.STDOUT)
        with log_file.open() as log:
            log.seek(start)
            output = log.read()
    summary = run.read_summary()
    if proc.returncode != 0 or summary is None:
        raise TrainingJobFailed(
            f"training job in {run.path} exited with code {proc.returncode}"
            + (" without writing summary.json" if summary is None else "") + _failure_detail(output, log_file))
    return summary


@dataclass(frozen=True)
class PinnedRun:
    """What :func:`train_pinned` hands back."""

    summary: RunSummary
    reused: bool  # the run had finished already: nothing was pinned or launched


def pin_train_config(env: str | None, dataset_root: str | Path, dataset_version: str, path: Path,
                     overrides: dict[str, dict[str, Any]] | None = None) -> Path:
    """Write ``conf/<env>/train.toml`` with per-slice ``overrides`` applied and the dataset pinned
    (``data.dataset_root``, ``data.version``: these two win over ``overrides``) to ``path``; returns
    ``path``. The workers then read exactly that version, whatever ``LATEST`` points at by the time
    they start (``dataset_version`` "" leaves it to ``LATEST``). ConfigError, before anything is
    written, when the result is not a valid config."""
    from pipeline.training.config import derive_train_config, write_train_toml

    table = {section: dict(values) for section, values in (overrides or {}).items()}
    table["data"] = {**table.get("data", {}), "dataset_root": str(dataset_root), "version": dataset_version}
    return write_train_toml(derive_train_config(env, table), path)


def train_pinned(run: RunDir, dataset_root: str | Path, dataset_version: str, config_file: Path, torchrun: Torchrun,
                 *, env: str | None = None, overrides: dict[str, dict[str, Any]] | None = None,
                 log_file: Path | None = None) -> PinnedRun:
    """Train on one dataset version into ``run``, reusing the run if it has finished.

    A finished run (``summary.json`` present) is returned as it is: no config is written and
    nothing is launched. Otherwise :func:`pin_train_config` writes ``config_file`` (``env``'s
    train.toml, ``overrides``, the dataset) and :func:`run_training` launches torchrun on it; an
    unfinished run resumes from its latest checkpoint. ``dataset_root`` is the one source of the
    root: pinned in the file, so the file says what the run read, and passed as ``--dataset-root``
    too, since ``$FRAUD_DATASET_ROOT`` wins over the file and the flag wins over both.

    Raises ConfigError (nothing launched), :class:`TrainingCannotStart`, :class:`TrainingJobFailed`,
    and RunSummaryError when ``run`` holds a malformed summary.
    """
    summary = run.read_summary()
    if summary is not None:
        return PinnedRun(summary, reused=True)
    config = pin_train_config(env, dataset_root, dataset_version, config_file, overrides)
    summary = run_training(None, run.path, Path(dataset_root), torchrun, config_path=config, log_file=log_file)
    return PinnedRun(summary, reused=False)


def _failure_detail(output: str, log_file: Path | None) -> str:
    """The job's own reason when it printed one, else the output's tail; and where the rest is."""
    reasons = [line for line in output.splitlines() if FAILURE_MARKER in line]
    detail = reasons[-1] if reasons else output[-3000:]
    where = f" (full output: {log_file})" if log_file else ""
    return (f": {detail}" if detail else "") + where
