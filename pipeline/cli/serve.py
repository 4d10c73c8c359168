"""``fraudctl serve`` (the scoring service, whole or one partition of a tier), ``fraudctl route`` (the
tier's front) and ``fraudctl consistency`` (online vs offline features).

Thin: parse options, load ``conf/<env>/``, call :mod:`pipeline.serving`. FastAPI, torch, MLflow and
Spark are imported when a command runs, never at import time (``fraudctl --help`` stays fast).
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from pipeline.cli.context import cli_context, parse_date
from pipeline.config import ConfigError

if TYPE_CHECKING:  # pandas and the feature kernel: imported where the command runs
    from pipeline.serving.consistency import ConsistencyReport


def keep_spark_out() -> None:
    """Make ``import pyspark`` fail in this process, unless it already ran.

    The scoring process never runs Spark, but MLflow probes for it when imported
    (``mlflow.types.schema``: ``try: import pyspark``) and, wherever pyspark is installed (a venv shared
    with ingest, as here), loads ~90 modules and ~30 MB into the service for nothing. A ``None`` entry
    makes that probe take its "not installed" branch. Called first thing by ``serve``, in its own process.
    """
    sys.modules.setdefault("pyspark", None)


@click.command()
@click.option("--host", default=None, help="Listen address (default: server.host of conf/<env>/serving.toml, "
              "$FRAUD_SERVING_HOST; loopback).")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Listen port (default: server.port of serving.toml, $FRAUD_SERVING_PORT).")
@click.option("--kafka/--no-kafka", "with_kafka", default=True, show_default=True,
              help="Follow the transactions and labels topics and publish to the scores topic "
                   "(--no-kafka: features from scored payments only, no scores topic).")
@click.option("--partition", "partition", default=None, metavar="I/N",
              help="Serve as partition I of N: own the cards the transactions topic's murmur2 partitioner puts on "
                   "its partitions p with p % N == I (421 for the others); merchants from the whole topic "
                   "(default: [partition] of serving.toml, 0/1: every card).")
@click.pass_context
def serve(ctx: click.Context, host: str | None, port: int | None, with_kafka: bool, partition: str | None) -> None:
    """Score payments over HTTP with the registry's champion (hot-reloaded when the alias moves).

    POST /score, POST /score/batch, GET /health, /ready, /metrics, admin endpoints (token:
    $FRAUD_SERVING_ADMIN_TOKEN); OpenAPI docs at /docs. Runs until SIGINT/SIGTERM. Exit code 1
    when the configuration is invalid or the server cannot start (e.g. the port is taken, or
    --partition cannot read the transactions topic).
    """
    keep_spark_out()
    from pipeline.kafka.admin import KafkaUnavailable
    from pipeline.serving.errors import ServingError
    from pipeline.serving.partitioning import parse_partition
    from pipeline.serving.server import run

    try:
        run(cli_context(ctx).env, host, port, with_kafka, parse_partition(partition) if partition else None)
    except (ConfigError, ServingError, KafkaUnavailable) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc


@click.command()
@click.option("--partitions", required=True, metavar="HOST:PORT,...",
              help="The scoring partitions in index order: the one started with --partition 0/N first.")
@click.option("--host", default=None, help="Listen address (default: server.host of serving.toml; loopback).")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Listen port (default: server.port of serving.toml).")
@click.pass_context
def route(ctx: click.Context, partitions: str, host: str | None, port: int | None) -> None:
    """Front a partitioned scoring tier: each POST /score goes to the partition owning its card
    (X-Card-Id header, else the body's card_id, by the topic's murmur2), /score/batch is split by
    owner, checked by every owner before any scores it, and put back in order; GET /health and
    /ready cover every partition. A partition that does not answer within [router] upstream_timeout_s
    of serving.toml is a 504 naming it (/health: degraded).

    Checks at start that the partitions say they are 0..N-1 of N over one topic. Runs until
    SIGINT/SIGTERM. Exit code 1 when a partition is missing or misconfigured, or the port is taken.
    """
    from pipeline.serving.config import load_serving_config
    from pipeline.serving.errors import ServingError
    from pipeline.serving.router import run_router

    addresses = [a.strip() for a in partitions.split(",") if a.strip()]
    if len(addresses) < 2 or any(not a.rpartition(":")[2].isdigit() for a in addresses):
        raise click.BadParameter("expected at least two HOST:PORT, comma-separated", param_hint="--partitions")
    try:
        config = load_serving_config(cli_context(ctx).env)
        server = config.server
        run_router(addresses, host or server.host, server.port if port is None else port, server.max_body_bytes,
                   server.max_batch_bytes, server.limit_concurrency, config.router.upstream_timeout_s)
    except (ConfigError, ServingError) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc


@click.command()
@click.option("--date", "day", required=True, callback=parse_date, metavar="YYYY-MM-DD",
              help="Event date (UTC) of the scored payments to check.")
@click.option("--min-share", type=click.FloatRange(0.0, 1.0), default=1.0, show_default=True,
              help="Exit 1 when fewer than this share of the scored payments match.")
@click.option("--tolerance", type=click.FloatRange(min=0.0), default=1e-9, show_default=True,
              help="Relative and absolute tolerance per feature value.")
@click.pass_context
def consistency(ctx: click.Context, day, min_share: float, tolerance: float) -> None:
    """Rebuild the features of the payments scored on DATE from the raw store and compare them with
    the values the service used (read back from the scores topic); then score the rebuilt features
    with each deciding version from the registry and compare its scores and decisions with the
    served ones. Prints a JSON report.

    Exit code 0 when at least --min-share of them match and every score and decision agrees, 1
    otherwise (or when a store is unreadable).
    """
    from pipeline.ingest.config import load_ingest_config
    from pipeline.kafka.admin import KafkaUnavailable
    from pipeline.kafka.settings import load_kafka_config
    from pipeline.registry.config import load_registry_config
    from pipeline.serving.config import load_serving_config
    from pipeline.serving.consistency import check_consistency

    env = cli_context(ctx).env
    try:
        ingest = load_ingest_config(env)
        report = check_consistency(day, load_kafka_config(env), load_serving_config(env).scores.topic,
                                   ingest.raw.root(), ingest.features, tolerance, registry=load_registry_config(env))
    except (ConfigError, KafkaUnavailable) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
    click.echo(json.dumps(report.to_dict(), indent=2))
    if report.scored == 0:
        raise click.ClickException(f"no decisions for payments of {day} on the scores topic: nothing to compare")
    if report.share < min_share:
        raise click.ClickException(consistency_shortfall(report, min_share))
    scores = report.scores
    if scores is not None and (scores.matched < scores.compared or scores.decisions_matched < scores.decisions_compared):
        raise click.ClickException(
            f"the features agree, but {scores.compared - scores.matched} of {scores.compared} served scores differ from "
            f"the registered version's on them (largest {scores.max_difference:.3g}) and "
            f"{scores.decisions_compared - scores.decisions_matched} of {scores.decisions_compared} decisions differ "
            "at the thresholds they record: the service does not score as the gate judged; see scores.examples")


def consistency_shortfall(report: ConsistencyReport, min_share: float) -> str:
    """Why fewer than ``min_share`` of the scored payments match, naming only what fell short: a
    payment the raw store lacks (``missing_offline``) and one whose features differ are different
    problems with different remedies."""
    causes = []
    if report.missing_offline:
        causes.append(f"{report.missing_offline} not in the raw store (missing_offline): ingest "
                      f"{report.date} first, or they were quarantined there")
    differing = report.compared - report.matched
    if differing:
        causes.append(f"{differing} with features that differ from the offline rebuild: see "
                      "mismatched_features and examples")
    return (f"{report.matched} of {report.scored} scored payments match ({report.share:.2%} < {min_share:.2%}); "
            + "; ".join(causes))
