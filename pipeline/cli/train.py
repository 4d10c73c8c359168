"""``fraudctl train``: run the DDP training job under torchrun, on this machine or as one node of several."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.context import cli_context
from pipeline.config import ConfigError
from pipeline.registry.config import load_registry_config
from pipeline.registry.errors import RegistryError


@click.command()
@click.option("--nproc", type=click.IntRange(min=1), default=2, show_default=True,
              help="Processes (ranks) on this machine; one per GPU on CUDA.")
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Nodes in the job: run the same command on each (same --run-name on shared storage).")
@click.option("--rdzv-endpoint", default="",
              help="host:port of the c10d rendezvous on node 0, reachable from every node (needed with --nnodes > 1).")
@click.option("--run-name", default=None, help="Run directory name under <state>/runs (default train-<UTC time>).")
@click.option("--dataset-root", type=click.Path(path_type=Path), default=None,
              help="Dataset root with manifests/ (default: data.dataset_root of conf/<env>/train.toml).")
@click.option("--max-restarts", type=click.IntRange(min=0), default=1, show_default=True,
              help="Times torchrun restarts the group after a worker dies (it resumes from the last checkpoint).")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Continue from the run's latest checkpoint, or refuse to touch an existing run.")
@click.option("--register/--no-register", default=None,
              help="Log the finished run to MLflow and register it as `challenger` (conf/<env>/registry.toml). "
                   "Default: on for one node, off with --nnodes > 1 (register once: `fraudctl register`).")
@click.pass_context
def train(ctx: click.Context, nproc: int, nnodes: int, rdzv_endpoint: str, run_name: str | None,
          dataset_root: Path | None, max_restarts: int, resume: bool, register: bool | None) -> None:
    """Train the fraud model with DistributedDataParallel (gloo on CPU, nccl on CUDA).

    Prints rank 0's live progress, then validation metrics, gradient bytes saved and where the
    checkpoints and model are. Exit code 1 when the job fails (the message says why).

    With --nnodes N every node runs this command with the same --rdzv-endpoint and --run-name; the
    run directory and the dataset must be on storage all nodes share (README, "Multi-node training").
    """
    from pipeline.training.launch import Torchrun, TrainingJobFailed, default_run_name, run_training
    from pipeline.training.progress import format_bytes
    from pipeline.training.run_dir import RunDir

    if nnodes > 1 and run_name is None:
        raise click.UsageError("--nnodes > 1 needs --run-name: every node must write the same run directory")
    try:
        torchrun = Torchrun(nproc_per_node=nproc, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint,
                            max_restarts=max_restarts)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    run = RunDir.named(run_name or default_run_name())
    click.echo(f"run directory: {run.path}")
    try:
        summary = run_training(cli_context(ctx).env, run.path, dataset_root, torchrun, resume)
    except TrainingJobFailed as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"validation (best epoch {summary.best_epoch}): "
               + "  ".join(f"{k} {v:.4f}" for k, v in sorted(summary.best_metrics.items())))
    sent, dense = summary.bytes_sent_total, summary.bytes_dense_total
    ratio = dense / sent if sent else float("nan")
    click.echo(f"gradient traffic per rank: {format_bytes(sent)} sent vs {format_bytes(dense)} dense "
               f"({ratio:.1f}x less, {summary.compression.method})")
    ece = f"{summary.calibrated_ece:.4f}" if summary.calibrated_ece is not None else "n/a"
    click.echo(f"calibration: temperature {summary.temperature:.3f}, ECE {ece}")
    click.echo(f"checkpoints: {run.checkpoints}  (best: {run.best_checkpoint})")
    click.echo(f"model: {run.model}")
    # Every node ends with the same summary; registering from each would race for one version.
    should_register = nnodes == 1 if register is None else register
    if should_register:
        _register(cli_context(ctx).env, run.path)
    elif nnodes > 1:
        click.echo(f"not registered from a node of a multi-node job: run `fraudctl register --run-dir {run.path}` once")


def _register(env: str, run_dir: Path) -> None:
    """Every finished run becomes a registered `challenger`; the gate (`fraudctl promote`) decides the rest."""
    from pipeline.registry.tracking import register_run

    try:
        config = load_registry_config(env)
        version = register_run(run_dir, config)
    except (RegistryError, ConfigError) as exc:
        raise click.ClickException(f"training finished but registering it failed ({type(exc).__name__}: {exc}); "
                                   f"fix that, then run `fraudctl register --run-dir {run_dir}`") from exc
    click.echo(f"registered {config.model_name} v{version} as challenger; `fraudctl promote` gates it")
