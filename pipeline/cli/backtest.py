"""``fraudctl backtest``: the pipeline judged on the raw store's history with the evaluation protocol.

Thin: parse the layout, call :func:`pipeline.backtest.run_backtest`, print the protocol's figures.
Exit 1 with the job's message when the raw store cannot make the layout (too short, labels not
mature yet, a split below the configured minimum) or training fails; 2 on a bad option.
"""

from __future__ import annotations

import math
from pathlib import Path

import click

from pipeline.cli.context import cli_context, output_console, parse_date

SHOWN = ("card_precision_at_100", "auc_roc", "average_precision", "recall_at_1pct_fpr", "ece", "n", "n_fraud",
         "n_known_removed")


@click.command()
@click.option("--train-end", required=True, callback=parse_date, metavar="YYYY-MM-DD",
              help="Last day the model learns from (its validation days end here).")
@click.option("--train-days", required=True, type=click.IntRange(min=1), help="Days the model is fitted on.")
@click.option("--validation-days", type=click.IntRange(min=1), default=None,
              help="Days after them for early stopping and calibration (default: ingest.toml's validation_days).")
@click.option("--gap-days", required=True, type=click.IntRange(min=1),
              help="Label maturity G: days between training and test; training labels are those known G days "
                   "after --train-end.")
@click.option("--test-days", required=True, type=click.IntRange(min=1), help="Days scored after the gap.")
@click.option("--processes", type=click.IntRange(min=1), default=2, show_default=True,
              help="Training processes (torchrun --nproc-per-node).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output directory (default: <state>/backtests/<layout>); a re-run there reuses what is done.")
@click.pass_context
def backtest(ctx: click.Context, train_end, train_days: int, validation_days: int | None, gap_days: int,
             test_days: int, processes: int, out: Path | None) -> None:
    """Build a dataset for one backtest layout from the raw store, train on it, score its test days.

    Train and validation rows end on --train-end with labels as known --gap-days later; the test
    days follow the gap, with fully matured labels, and cards already known compromised are
    dropped per day. Prints card precision@100, AUC, AP, recall at 1% FPR and ECE, and writes
    report.json (every figure, the layout, the dataset and the run) to the output directory.
    """
    from pipeline.backtest import REPORT_FILE, BacktestSpec, run_backtest
    from pipeline.evaluation.protocol import BacktestDays
    from pipeline.ingest.config import load_ingest_config
    from pipeline.ingest.job import failure_message
    from pipeline.paths import state_dir
    from pipeline.training.launch import Torchrun, TrainingJobFailed

    env = cli_context(ctx).env
    try:
        config = load_ingest_config(env)
        days = BacktestDays(train_days, validation_days or config.dataset.validation_days, gap_days, test_days)
        spec = BacktestSpec(train_end, days)
        out = out or state_dir() / "backtests" / spec.name
        report = run_backtest(env, config, spec, out, Torchrun(nproc_per_node=processes), echo=click.echo)
    except TrainingJobFailed as exc:
        raise click.ClickException(f"training failed: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the ingest job's expected failures exit 1 with their message
        message = failure_message(exc)
        if message is None:
            raise
        raise click.ClickException(message) from exc
    console = output_console()
    metrics = report["metrics"]
    for key in SHOWN:
        value = metrics.get(key, math.nan)
        console.print(f"{key:>24}  {value:.4f}" if isinstance(value, float) else f"{key:>24}  {value}")
    for pattern, recall in metrics.get("pattern_recall", {}).items():
        console.print(f"{'recall@top1% ' + pattern:>24}  {recall:.3f}")
    console.print(f"report: {out / REPORT_FILE}")
