"""The demo's story, stage by stage: broker -> publish a night -> ingest -> train -> gate -> stop.

Every stage calls the same library entry points the production jobs use (no demo-only paths);
the demo only chooses small sizes (conf/<env>/demo.toml) and prints a summary per stage.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from datetime import date
from pathlib import Path

from pipeline.contract import Kind
from pipeline.demo.dirty import dirty_transactions, publish_raw
from pipeline.demo.nights import (
    DemoConfig,
    Night,
    labels_published_on,
    load_played,
    plan_nights,
    save_played,
    simulate_night,
)
from pipeline.ingest.config import load_ingest_config
from pipeline.ingest.job import IngestReport, run_nightly
from pipeline.ingest.progress import Progress, print_summary
from pipeline.kafka.broker import EmbeddedBroker, free_port
from pipeline.kafka.producer import publish_records
from pipeline.kafka.reader import read_topic
from pipeline.kafka.settings import KafkaConfig, load_kafka_config
from pipeline.paths import state_dir
from pipeline.registry.config import load_registry_config
from pipeline.registry.promotion import run_gate
from pipeline.registry.report import format_gate_report
from pipeline.registry.tracking import register_run
from pipeline.simulation import load_simulation_config
from pipeline.training.launch import run_training
from pipeline.training.progress import format_bytes


class DemoFailed(RuntimeError):
    """A stage failed; the message names the stage and what to look at."""


def run_demo(env: str, demo: DemoConfig, echo: Callable[[str], None] = print) -> int:
    """Play the next night end to end. Returns the gate's exit code (0 promoted, 3 rejected)."""
    state = state_dir()
    base = load_simulation_config(env)
    played = load_played(state)
    nights = plan_nights(date.fromisoformat(base.start_date), played, demo)
    tonight = nights[-1]
    echo(f"== night {tonight.index + 1}: payments {tonight.start}..{tonight.run_date} "
         f"({played} earlier night(s) replayed into the fresh in-memory broker)")
    broker = EmbeddedBroker("127.0.0.1", free_port(), state / "demo" / "broker.log")
    started = time.monotonic()
    with _stage(echo, "broker"):
        broker.start()
        kafka = dataclasses.replace(load_kafka_config(env), bootstrap_servers=broker.bootstrap_servers)
        broker.create_topics(kafka.topics(), kafka.partitions)
        echo(f"   Tansu pid {broker.process.pid} on {broker.bootstrap_servers}, topics {', '.join(kafka.topics())}")
    try:
        with _stage(echo, "simulate + publish"):
            publish_nights(kafka, nights, base, demo, echo)
        with _stage(echo, "ingest (Spark)"):
            report = run_nightly(load_ingest_config(env), kafka, tonight.run_date, progress=Progress(emit=echo))
            print_summary(report)
            save_played(state, played + 1)  # the raw store has committed this night's offsets
    finally:
        broker.stop()
        echo(f"   broker pid {broker.process.pid} stopped")
    gate_code = train_and_gate(env, demo, tonight, report, echo)
    echo(f"== night {tonight.index + 1} done in {time.monotonic() - started:.0f}s; run `make demo` again for the next night")
    return gate_code


def publish_nights(kafka: KafkaConfig, nights: list[Night], base, demo: DemoConfig,
                   echo: Callable[[str], None]) -> None:
    """Replay earlier nights and publish tonight's, in the same order every time (same offsets)."""
    sims = []
    sent = Counter()
    for i, night in enumerate(nights):
        sims.append(simulate_night(night, base, demo))
        sim = sims[-1]
        labels = labels_published_on(night, nights[i - 1] if i else None, sims)
        dirty = dirty_transactions(sim.transactions, demo.dirty_records_per_night)
        tx = publish_records(kafka, kafka.transactions_topic, Kind.TRANSACTION, sim.transaction_records())
        raw = publish_raw(kafka, kafka.transactions_topic, [(k, v) for _, k, v in dirty])
        lab = publish_records(kafka, kafka.labels_topic, Kind.LABEL, labels.to_dict("records"))
        for r in (tx, lab):
            if not r.ok:
                raise DemoFailed(f"publishing night {night.index + 1} to {r.topic}: {r.failed} failed ({r.errors[:3]})")
        sent.update({"transactions": tx.sent + raw, "labels": lab.sent})
        if night is nights[-1]:
            frauds = int(sim.truth["is_fraud"].sum())
            reasons = Counter(str(reason) if reason else "duplicate" for reason, _, _ in dirty)
            echo(f"   tonight: {len(sim.transactions)} payments ({frauds} fraudulent: "
                 + ", ".join(f"{k} {v}" for k, v in sim.pattern_counts().items() if k != "genuine")
                 + f"), {lab.sent} fraud reports made by {night.run_date}, "
                 + f"{len(dirty)} bad/duplicate records mixed in ({dict(reasons)})")
    back = {topic: len(read_topic(kafka, topic)) for topic in kafka.topics()}
    echo(f"   published {sent['transactions']} transaction and {sent['labels']} label records in all; "
         f"read back {back[kafka.transactions_topic]} and {back[kafka.labels_topic]}")
    if back != {kafka.transactions_topic: sent["transactions"], kafka.labels_topic: sent["labels"]}:
        raise DemoFailed(f"Kafka round trip lost records: sent {dict(sent)}, read back {back}")


def train_and_gate(env: str, demo: DemoConfig, night: Night, report: IngestReport,
                   echo: Callable[[str], None]) -> int:
    dataset_root = Path(report.dataset.root)
    run_dir = state_dir() / "runs" / f"demo-night-{night.index + 1:03d}"
    with _stage(echo, f"train ({demo.train_processes} DDP processes, gloo)"):
        summary = run_training(env, run_dir, dataset_root, demo.train_processes)
        best = summary["best_metrics"]
        sent, dense = summary["bytes_sent_total"], summary["bytes_dense_total"]
        echo(f"   validation (best epoch {summary['best_epoch']}): AUC {best['auc_roc']:.4f}  "
             f"AP {best['average_precision']:.4f}  recall@1%FPR {best['recall_at_1pct_fpr']:.4f}  "
             f"card P@100 {best['card_precision_at_100']:.3f}")
        echo(f"   gradients: {format_bytes(sent)} sent instead of {format_bytes(dense)} dense "
             f"({dense / max(sent, 1):.0f}x less, {summary['compression']['method']} "
             f"density {summary['compression']['density']})")
        echo(f"   checkpoints: {summary['checkpoint_dir']}   model: {summary['model_dir']}")
    registry = load_registry_config(env)
    with _stage(echo, "register + gate (MLflow)"):
        version = register_run(run_dir, registry)
        echo(f"   registered {registry.model_name} v{version} as challenger")
        gate = run_gate(registry, dataset_root)
        echo("   " + format_gate_report(gate).replace("\n", "\n   "))
    return gate.exit_code


class _stage:
    """Prints ``-- name`` and its duration; names the stage in any error escaping it."""

    def __init__(self, echo: Callable[[str], None], name: str) -> None:
        self.echo, self.name = echo, name

    def __enter__(self) -> None:
        self.started = time.monotonic()
        self.echo(f"-- {self.name}")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.echo(f"   ({time.monotonic() - self.started:.1f}s)")
        elif not isinstance(exc, DemoFailed):
            raise DemoFailed(f"stage '{self.name}' failed: {exc}") from exc
