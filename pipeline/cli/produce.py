"""``fraudctl produce``: replay a JSONL or Parquet file of transactions and/or labels into Kafka.

Exit codes: 0 every valid record acknowledged (bad lines, if any, are in the reject file);
1 a delivery failed, the broker is unreachable, or ``--strict`` found bad lines (nothing sent);
2 usage error.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from pipeline.cli.context import bootstrap_option, cli_context, output_console
from pipeline.contract import Kind
from pipeline.kafka.admin import KafkaUnavailable
from pipeline.kafka.producer import DeliveryReport, publish_records, topic_for
from pipeline.kafka.settings import KafkaConfig, load_kafka_config

if TYPE_CHECKING:  # pipeline.simulation loads pandas: imported where a command runs
    from pipeline.simulation.io import EventScan

SHOWN_REJECTS = 20  # bad lines printed to the terminal; the reject file has all of them


def kafka_from_cli(ctx: click.Context, bootstrap_servers: str | None) -> KafkaConfig:
    kafka = load_kafka_config(cli_context(ctx).env)
    return dataclasses.replace(kafka, bootstrap_servers=bootstrap_servers) if bootstrap_servers else kafka


def publish_with_progress(kafka: KafkaConfig, topic: str, kind: Kind, records: Iterable[dict[str, Any]],
                          total: int, console: Console) -> DeliveryReport:
    """:func:`publish_records` under a progress bar; ``KafkaUnavailable`` becomes a ClickException."""
    columns = (TextColumn(f"{topic} ({kind.value})", markup=False), BarColumn(), MofNCompleteColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("publish", total=total)
        try:
            return publish_records(kafka, topic, kind, records, progress=lambda n: bar.advance(task, n))
        except KafkaUnavailable as exc:
            raise click.ClickException(str(exc)) from exc


def require_delivered(reports: list[DeliveryReport]) -> None:
    """Raise (exit 1) naming every topic with failed deliveries and its first errors."""
    failed = [r for r in reports if not r.ok]
    if failed:
        lines = [f"{r.topic}: {r.failed} failed ({'; '.join(r.errors[:3])})" for r in failed]
        raise click.ClickException("delivery failed: " + " | ".join(lines))


@click.command()
@click.option("--file", "path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="JSONL (one event per line) or Parquet file of transactions and/or labels.")
@click.option("--topic", default=None, help="Send every record here instead of its kind's configured topic.")
@click.option("--strict", is_flag=True, help="Send nothing if any line is bad (exit 1).")
@click.option("--reject-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where bad lines go (default: <file>.rejects.jsonl next to the input).")
@bootstrap_option
@click.pass_context
def produce(ctx: click.Context, path: Path, topic: str | None, strict: bool, reject_file: Path | None,
            bootstrap_servers: str | None) -> None:
    """Validate every line against the event contract and publish the valid ones, keyed per contract.

    Every line ends either sent or rejected with a named reason (printed, and kept in the reject file).
    """
    from pipeline.simulation.io import EventFileError, read_event_lines, scan_events, write_rejects

    console = output_console()
    kafka = kafka_from_cli(ctx, bootstrap_servers)
    try:
        scan = scan_events(read_event_lines(path))
    except EventFileError as exc:
        raise click.ClickException(str(exc)) from exc
    _show_rejects(scan, console)
    if scan.rejected and strict:
        raise click.ClickException(f"{len(scan.rejected)} bad lines in {path}; nothing sent (--strict)")
    if scan.rejected:
        reject_path = reject_file or path.with_name(path.name + ".rejects.jsonl")
        write_rejects(scan.rejected, reject_path)
        console.print(f"rejected lines written to {reject_path}")

    groups: dict[tuple[str, Kind], list[dict[str, Any]]] = defaultdict(list)
    for event in scan.valid:
        groups[(topic or topic_for(kafka, event.kind), event.kind)].append(event.record)
    reports = [publish_with_progress(kafka, t, kind, records, len(records), console)
               for (t, kind), records in groups.items()]
    for report, (t, kind) in zip(reports, groups, strict=True):
        console.print(f"{t} ({kind.value}): sent {report.sent}, failed {report.failed}")
    rejected = ", ".join(f"{reason} {n}" for reason, n in scan.reject_counts().items()) or "none"
    console.print(f"lines: {len(scan.valid) + len(scan.rejected)}; valid {len(scan.valid)}; rejected: {rejected}")
    require_delivered(reports)


def _show_rejects(scan: EventScan, console: Console) -> None:
    for line in scan.rejected[:SHOWN_REJECTS]:
        console.print(f"line {line.line_no}: {line.rejection}", markup=False, highlight=False)
    if len(scan.rejected) > SHOWN_REJECTS:
        console.print(f"... and {len(scan.rejected) - SHOWN_REJECTS} more bad lines")
