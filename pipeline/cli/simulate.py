"""``fraudctl simulate``: generate a window of payments and labels; write files and/or publish to Kafka.

Publishing plays consecutive windows the way production sees them: a window sends its payments and
only the fraud reports made by its end. A report made later belongs to the window it falls in; that
window finds it by re-simulating the earlier ones (``--since``: same seed and options, so the same
records). Files (``--out``) hold every report about the window's payments, whenever it is made.

Exit codes (README.md, "## Exit codes"): 0 done; 1 bad config file, unreachable broker or failed
delivery; 2 usage error, including an option value the simulation config rejects.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from pipeline.cli.context import bootstrap_option, cli_context, output_console, parse_date
from pipeline.cli.produce import kafka_from_cli, publish_with_progress, require_delivered
from pipeline.config import ConfigError
from pipeline.contract import Kind
from pipeline.kafka.producer import topic_for

if TYPE_CHECKING:  # pipeline.simulation loads pandas: imported where the command runs
    import pandas as pd

    from pipeline.simulation import Simulation, SimulationConfig
    from pipeline.simulation.windows import Window

# pipeline.simulation.io.EVENT_FORMATS, spelled out: importing any pipeline.simulation module runs the
# package __init__, which loads pandas. tests/cli/test_simulate.py checks the two agree.
FILE_FORMATS = ("jsonl", "parquet")


@click.command(name="simulate")
@click.option("--days", type=int, default=None, help="Window length in days (default: simulation.toml).")
@click.option("--cards", "num_cards", type=int, default=None, help="Number of cards.")
@click.option("--seed", type=int, default=None, help="Random seed: same seed and dates, same data.")
@click.option("--start-date", callback=parse_date, metavar="YYYY-MM-DD", help="First day of the window (UTC).")
@click.option("--fraud-rate", type=float, default=None, help="Fraud share of transactions, e.g. 0.005.")
@click.option("--preset", default=None, metavar="NAME",
              help="Portfolio conf/<env>/simulation.NAME.toml instead of simulation.toml (default: $FRAUD_SIM_PRESET).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for transactions.<format> and labels.<format> (every report, whenever made).")
@click.option("--format", "fmt", type=click.Choice(FILE_FORMATS), default="jsonl", show_default=True)
@click.option("--publish", is_flag=True,
              help="Publish the window's transactions, and the fraud reports made by its end, to the configured topics.")
@click.option("--since", callback=parse_date, metavar="YYYY-MM-DD",
              help="With --publish: first day of the consecutive earlier windows already published (same "
                   "options and --days); their fraud reports made during this window are published too.")
@bootstrap_option
@click.pass_context
def simulate_command(ctx: click.Context, days: int | None, num_cards: int | None, seed: int | None,
                     start_date: date | None, fraud_rate: float | None, out: Path | None, fmt: str,
                     publish: bool, since: date | None, preset: str | None, bootstrap_servers: str | None) -> None:
    """Simulate card payments with fraud patterns and delayed fraud reports."""
    if out is None and not publish:
        raise click.UsageError("give --out DIR, --publish, or both")
    if since is not None and not publish:
        raise click.UsageError("--since only matters with --publish")
    from pipeline.simulation import simulate
    from pipeline.simulation.io import write_simulation

    overrides = {"days": days, "num_cards": num_cards, "seed": seed, "fraud_rate": fraud_rate,
                 "start_date": start_date.isoformat() if start_date else None}
    config = _config(cli_context(ctx).env, preset, {k: v for k, v in overrides.items() if v is not None})
    windows = _windows(config, since)
    console = output_console()
    started = time.perf_counter()
    sim = simulate(config)
    _print_summary(sim, time.perf_counter() - started, console)
    if out is not None:
        paths = write_simulation(sim, out, fmt)  # type: ignore[arg-type]
        console.print(f"wrote {paths['transactions']} and {paths['labels']}")
    if publish:
        labels = _reports_due(windows, sim)
        console.print(f"publishing {len(labels)} labels reported before {windows[-1].cutoff.isoformat()} about "
                      f"payments since {windows[0].start}; later reports belong to later windows (--since)")
        kafka = kafka_from_cli(ctx, bootstrap_servers)
        reports = [
            publish_with_progress(kafka, topic_for(kafka, Kind.TRANSACTION), Kind.TRANSACTION,
                                  sim.transaction_records(), len(sim.transactions), console),
            publish_with_progress(kafka, topic_for(kafka, Kind.LABEL), Kind.LABEL, labels.to_dict("records"),
                                  len(labels), console),
        ]
        for report in reports:
            console.print(f"{report.topic}: sent {report.sent}, failed {report.failed}")
        require_delivered(reports)


def _config(env: str, preset: str | None, overrides: dict[str, object]) -> SimulationConfig:
    """The env's simulation config (or preset) with the CLI's overrides: a bad file or unknown preset
    exits 1, a bad option 2."""
    from pipeline.simulation import load_simulation_config

    try:
        config = load_simulation_config(env, preset)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        return dataclasses.replace(config, **overrides)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc


def _windows(config: SimulationConfig, since: date | None) -> list[Window]:
    """The earlier windows from ``since`` and this one, oldest first; each cut off at its end."""
    from pipeline.simulation.windows import Window

    first, start = since or config.window_start, config.window_start
    span = (start - first).days
    if span < 0 or span % config.days:
        raise click.UsageError(f"--since {first} must be a whole number of {config.days}-day windows "
                               f"before the window's start {start}")
    return [Window(i, first + timedelta(days=i * config.days), config.days) for i in range(span // config.days + 1)]


def _reports_due(windows: list[Window], sim: Simulation) -> pd.DataFrame:
    """Labels made during the last window (before its end), about its payments or earlier windows'."""
    from pipeline.simulation import simulate
    from pipeline.simulation.windows import labels_published_on

    earlier = [simulate(dataclasses.replace(sim.config, start_date=w.start.isoformat())) for w in windows[:-1]]
    previous = windows[-2] if len(windows) > 1 else None
    return labels_published_on(windows[-1], previous, [*earlier, sim])


def _print_summary(sim: Simulation, elapsed_s: float, console: Console) -> None:
    from pipeline.simulation import GENUINE

    cfg = sim.config
    n = len(sim.transactions)
    counts = sim.pattern_counts()
    fraud = n - counts[GENUINE]
    console.print(f"simulated {n} transactions: {cfg.start_date} + {cfg.days} days, {cfg.num_cards} cards, "
                  f"seed {cfg.seed}; {elapsed_s:.2f}s, {n / max(elapsed_s, 1e-9):,.0f} events/s")
    patterns = ", ".join(f"{name} {c}" for name, c in counts.items() if name != GENUINE)
    console.print(f"fraud: {fraud} ({fraud / max(n, 1):.3%}; configured {cfg.fraud_rate:.3%}): {patterns}")
    labels = sim.labels
    window_end = (cfg.window_start + timedelta(days=cfg.days)).isoformat()
    late = int((labels["reported_at"] >= window_end).sum())
    console.print(f"labels: {len(labels)} ({int(labels['is_fraud'].sum())} fraud reports, "
                  f"{int((~labels['is_fraud']).sum())} cleared); {late} reported after the window")
