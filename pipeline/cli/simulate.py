"""``fraudctl simulate``: generate a window of payments and labels; write files and/or publish to Kafka.

Exit codes: 0 done; 1 bad config value, unreachable broker or failed delivery; 2 usage error.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta
from pathlib import Path

import click
from rich.console import Console

from pipeline.cli.context import bootstrap_option, cli_context
from pipeline.cli.produce import kafka_from_cli, publish_with_progress, require_delivered
from pipeline.config import ConfigError
from pipeline.contract import Kind
from pipeline.kafka.producer import topic_for
from pipeline.simulation import GENUINE, Simulation, SimulationConfig, load_simulation_config, simulate
from pipeline.simulation.io import EVENT_FORMATS, write_simulation


@click.command(name="simulate")
@click.option("--days", type=int, default=None, help="Window length in days (default: simulation.toml).")
@click.option("--cards", "num_cards", type=int, default=None, help="Number of cards.")
@click.option("--seed", type=int, default=None, help="Random seed: same seed and dates, same data.")
@click.option("--start-date", default=None, metavar="YYYY-MM-DD", help="First day of the window (UTC).")
@click.option("--fraud-rate", type=float, default=None, help="Fraud share of transactions, e.g. 0.005.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for transactions.<format> and labels.<format>.")
@click.option("--format", "fmt", type=click.Choice(EVENT_FORMATS), default="jsonl", show_default=True)
@click.option("--publish", is_flag=True, help="Publish transactions and labels to the configured topics.")
@bootstrap_option
@click.pass_context
def simulate_command(ctx: click.Context, days: int | None, num_cards: int | None, seed: int | None,
                     start_date: str | None, fraud_rate: float | None, out: Path | None, fmt: str,
                     publish: bool, bootstrap_servers: str | None) -> None:
    """Simulate card payments with fraud patterns and delayed fraud reports."""
    if out is None and not publish:
        raise click.UsageError("give --out DIR, --publish, or both")
    overrides = {"days": days, "num_cards": num_cards, "seed": seed, "start_date": start_date,
                 "fraud_rate": fraud_rate}
    try:
        config = load_simulation_config(cli_context(ctx).env)
        config = dataclasses.replace(config, **{k: v for k, v in overrides.items() if v is not None})
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    console = Console(soft_wrap=True)  # long lines stay whole in logs
    started = time.perf_counter()
    sim = simulate(config)
    elapsed = time.perf_counter() - started
    _print_summary(sim, elapsed, console)
    if out is not None:
        paths = write_simulation(sim, out, fmt)  # type: ignore[arg-type]
        console.print(f"wrote {paths['transactions']} and {paths['labels']}")
    if publish:
        kafka = kafka_from_cli(ctx, bootstrap_servers)
        reports = [
            publish_with_progress(kafka, topic_for(kafka, Kind.TRANSACTION), Kind.TRANSACTION,
                                  sim.transaction_records(), len(sim.transactions), console),
            publish_with_progress(kafka, topic_for(kafka, Kind.LABEL), Kind.LABEL, sim.label_records(),
                                  len(sim.labels), console),
        ]
        for report in reports:
            console.print(f"{report.topic}: sent {report.sent}, failed {report.failed}")
        require_delivered(reports)


def _print_summary(sim: Simulation, elapsed_s: float, console: Console) -> None:
    cfg: SimulationConfig = sim.config
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
