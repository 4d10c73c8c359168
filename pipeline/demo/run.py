"""The demo: start a broker, publish the next simulated night, run the nightly cycle beside the
scoring service, score a few live payments, summarise.

The cycle is the production one (:func:`pipeline.nightly.cycle.run_cycle`, what ``fraudctl nightly``
and the fraud_nightly DAG run) and the service is ``fraudctl serve`` (:mod:`pipeline.demo.serving`);
the demo only supplies what production has already: a Kafka cluster (the embedded broker, with the
nights played so far replayed into it), a night of traffic (the simulator, sized by
conf/<env>/demo.toml) and a few of the next day's payments to score. Nothing here is a demo-only path.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from pipeline.contract import Kind
from pipeline.demo.dirty import dirty_transactions, publish_raw
from pipeline.demo.live_days import (
    LiveDay,
    holdout_promise,
    load_live_days,
    pooled_lines,
    record_live_day,
    reported_frauds,
)
from pipeline.demo.nights import (
    DemoConfig,
    Night,
    labels_published_on,
    load_failure,
    load_played,
    plan_nights,
    save_played,
    simulate_night,
)
from pipeline.demo.scores_log import replay_scores, save_scores
from pipeline.demo.serving import STOPPING, ServingFigures, ServingStep, pick_live_payments, serving_summary
from pipeline.kafka.broker import EmbeddedBroker, free_port
from pipeline.kafka.producer import publish_records
from pipeline.kafka.reader import read_topic
from pipeline.kafka.settings import KafkaConfig, load_kafka_config
from pipeline.nightly.records import NightReport
from pipeline.paths import state_dir
from pipeline.serving.config import load_serving_config
from pipeline.simulation import load_simulation_config
from pipeline.training.launch import Torchrun

Echo = Callable[[str], None]


class DemoFailed(RuntimeError):
    """A stage failed; the message names the stage and what to look at."""


@dataclass(frozen=True)
class Tonight:
    """What the night's traffic held (the simulator's truth, which Kafka never carries)."""

    payments: int
    frauds: int
    reports: int
    bad_records: int


def run_demo(env: str, demo: DemoConfig, echo: Echo = print) -> NightReport:
    """Play the next night end to end and return its report (the gate promoted or rejected).

    The scoring service runs inside the broker's lifetime (see :mod:`pipeline.demo.serving`): it
    starts before the cycle on the current champion, follows the gate, scores the whole next day
    and is stopped before the broker; the day's figures go to ``live_days.jsonl``. Raises DemoFailed
    naming the stage when one fails, and records the failure: the next run says so and plays the
    same night again (its records replay identically and every stage of the cycle is idempotent),
    so no night's live day is skipped.
    """
    state = state_dir()
    played = load_played(state)
    failure = load_failure(state)
    if failure is not None:
        echo(f"!! night {played + 1} did not finish when it was last played ({failure}); playing it again: "
             "every stage is idempotent, and its live day is scored this time")
    try:
        return _run_night(env, demo, state, played, echo)
    except DemoFailed as exc:
        save_played(state, played, failure=str(exc))
        raise


def _run_night(env: str, demo: DemoConfig, state: Path, played: int, echo: Echo) -> NightReport:
    """Night ``played + 1`` from the broker's start to the summary; counted as played only once its live
    day was scored (or there was no champion to score it), so a failure anywhere plays it again."""
    from pipeline.nightly.cycle import CycleConfig

    base = load_simulation_config(env)
    first = date.fromisoformat(base.start_date)
    nights = plan_nights(first, played, demo)
    tonight, tomorrow = nights[-1], plan_nights(first, played + 1, demo)[-1]
    echo(f"== night {tonight.index + 1}: payments {tonight.start}..{tonight.run_date} "
         f"({played} earlier night(s) replayed into the fresh in-memory broker)")
    broker = EmbeddedBroker("127.0.0.1", free_port(), state / "demo" / "broker.log")
    started = time.monotonic()
    with _stage(echo, "broker"):
        broker.start()
        kafka = dataclasses.replace(load_kafka_config(env), bootstrap_servers=broker.bootstrap_servers)
        broker.create_topics(kafka.topics(), kafka.partitions)
        echo(f"   Tansu pid {broker.process.pid} on {broker.bootstrap_servers}, topics {', '.join(kafka.topics())}")
    scores_topic, scores_log = load_serving_config(env).scores.topic, state / "demo" / "scores.jsonl"
    try:
        with _stage(echo, "simulate + publish"):
            traffic = publish_nights(kafka, nights, base, demo, echo)
            replayed = replay_scores(kafka, scores_topic, scores_log)
            echo(f"   {replayed} earlier live decisions replayed into {scores_topic} (what the monitor judges)")
        cycle = dataclasses.replace(CycleConfig.load(env), kafka=kafka,
                                    torchrun=Torchrun(nproc_per_node=demo.train_processes))
        maturity_days = cycle.ingest.dataset.label_maturity_days
        with ServingStep(env, kafka, cycle.registry, state / "demo", echo) as serving:
            with _stage(echo, "scoring service (fraudctl serve)"):
                serving.start_on_champion()
            night = _play(cycle, tonight, echo)
            with _stage(echo, f"scoring service: live payments of {tomorrow.start}"):
                day = simulate_night(tomorrow, base, demo)
                reported = reported_frauds(day.labels, tomorrow.start, maturity_days)
                served = serving.score_live(night, tomorrow.start, day, pick_live_payments(day), reported)
        save_scores(kafka, scores_topic, scores_log)  # the service has stopped: its decisions are all on the topic
    finally:
        broker.stop()
        echo(f"   broker pid {broker.process.pid} stopped")
    live_days = (record_live_day(state / "demo", live_day(tonight, night, served, maturity_days))
                 if served is not None else load_live_days(state / "demo"))
    save_played(state, played + 1)
    for line in summary_lines(tonight, traffic, night, cycle.registry, served, live_days,
                              time.monotonic() - started):
        echo(line)
    return night


def live_day(tonight: Night, night: NightReport, served: ServingFigures, maturity_days: int) -> LiveDay:
    """Tonight's line of live_days.jsonl: what the service decided on the live day, and the promise."""
    recall, interval = holdout_promise(night.gate, served.version)
    flagged = sum(served.decisions.get(d, 0) for d in STOPPING)
    return LiveDay(night=tonight.index + 1, live_day=served.day, version=served.version, payments=served.requests,
                   flagged=flagged, realised_review_rate=flagged / served.requests if served.requests else 0.0,
                   frauds=served.day_frauds, frauds_stopped=served.day_frauds_stopped,
                   review_budget=served.review_budget, holdout_recall_at_budget=recall, holdout_recall_ci=interval,
                   label_maturity_days=maturity_days, frauds_reported=served.day_frauds_reported,
                   frauds_reported_stopped=served.day_frauds_reported_stopped)


def _play(cycle, tonight: Night, echo: Echo) -> NightReport:
    """The production cycle (a CycleConfig) for tonight's run date; a stage failure becomes DemoFailed."""
    from pipeline.nightly.cycle import run_cycle
    from pipeline.nightly.stages import StageFailed

    try:
        return run_cycle(cycle, tonight.run_date, echo)
    except StageFailed as exc:
        raise DemoFailed(f"night {tonight.index + 1}: {exc}") from exc


def publish_nights(kafka: KafkaConfig, nights: list[Night], base, demo: DemoConfig, echo: Echo) -> Tonight:
    """Replay earlier nights and publish tonight's, in the same order every time (same offsets)."""
    sims = []
    sent = Counter()
    tonight = None
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
            tonight = Tonight(len(sim.transactions), int(sim.truth["is_fraud"].sum()), lab.sent, len(dirty))
            reasons = Counter(str(reason) if reason else "duplicate" for reason, _, _ in dirty)
            echo(f"   tonight: {tonight.payments} payments ({tonight.frauds} fraudulent: "
                 + ", ".join(f"{k} {v}" for k, v in sim.pattern_counts().items() if k != "genuine")
                 + f"), {tonight.reports} fraud reports made by {night.run_date}, "
                 + f"{tonight.bad_records} bad/duplicate records mixed in ({dict(reasons)})")
    back = {topic: len(read_topic(kafka, topic)) for topic in kafka.topics()}
    echo(f"   published {sent['transactions']} transaction and {sent['labels']} label records in all; "
         f"read back {back[kafka.transactions_topic]} and {back[kafka.labels_topic]}")
    if back != {kafka.transactions_topic: sent["transactions"], kafka.labels_topic: sent["labels"]}:
        raise DemoFailed(f"Kafka round trip lost records: sent {dict(sent)}, read back {back}")
    return tonight


def summary_lines(tonight: Night, traffic: Tonight, night: NightReport, registry, served: ServingFigures | None,
                  live_days: list[LiveDay], seconds: float) -> list[str]:
    """The end of the demo: counts, metrics, decision, the service's figures, and where to look next."""
    from pipeline.nightly.text import SHOWN_VALIDATION, decision_line, monitor_line
    from pipeline.registry.config import resolved_tracking_uri

    run, gate = night.run, night.gate
    landed = {a.kind: a for a in night.dataset.landed}
    tx = landed.get(Kind.TRANSACTION.value)
    validation = "  ".join(f"{label} {run.best_metrics[key]:.4f}" for key, label in SHOWN_VALIDATION
                           if key in run.best_metrics)
    holdout = "  ".join(f"{key} {value:.4f}" for key, value in gate.challenger_metrics.items()
                        if key in ("auc_roc", "average_precision") and value is not None)
    lines = [
        f"== summary of night {tonight.index + 1} (run date {night.run_date}), {seconds:.0f}s",
        f"   traffic: {traffic.payments} payments ({traffic.frauds} fraudulent), {traffic.reports} fraud reports, "
        f"{traffic.bad_records} bad or duplicate records",
    ]
    if tx is not None:
        lines.append(f"   ingested: {tx.read} transaction records read, {tx.valid} valid, {tx.quarantined} quarantined, "
                     f"{tx.duplicates} duplicates")
    lines += [
        f"   dataset: {night.dataset.name}@{night.dataset.version} ({night.dataset.rows} rows, "
        f"{night.dataset.frauds} frauds)",
        f"   validation: {validation}",
        f"   gate holdout (challenger): {holdout}",
        f"   {decision_line(gate)}",
        f"   model: {night.model.model_name} v{night.model.version}; champion "
        + (f"v{gate.champion_version}" if gate.champion_version else "none yet"),
        *serving_summary(served),
        *pooled_lines(live_days),
        f"   live model, {monitor_line(night.monitor)}" + _maturity_note(night),
        f"   plots: {plots_location(registry, night.model.version)}",
        f"   runs, metrics and models: mlflow ui --backend-store-uri {resolved_tracking_uri(registry)}",
        f"   run directory: {run.run_dir}",
        "   decisions so far: fraudctl history",
        f"   state: {state_dir()} (`make clean` removes it); `make demo` again plays the next night",
    ]
    return lines


def _maturity_note(night: NightReport) -> str:
    """Why a day without live decisions has nothing to judge yet: labels mature after the live day."""
    if night.monitor is None or night.monitor.state != "nothing_to_monitor":
        return ""
    return (" (the live days the demo scores are judged once their fraud reports have matured: "
            "label_maturity_days after each)")


def plots_location(registry, version: int) -> str:
    """Where the registered version's run keeps its plots (ROC, PR, calibration, training curves)."""
    from pipeline.registry.store import connect

    client = connect(registry)
    run_id = client.get_model_version(registry.model_name, str(version)).run_id
    return f"{client.get_run(run_id).info.artifact_uri}/plots"


class _stage:
    """Prints ``-- name`` and its duration; names the stage in any error escaping it."""

    def __init__(self, echo: Echo, name: str) -> None:
        self.echo, self.name = echo, name

    def __enter__(self) -> None:
        self.started = time.monotonic()
        self.echo(f"-- {self.name}")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.echo(f"   ({time.monotonic() - self.started:.1f}s)")
        elif not isinstance(exc, DemoFailed):
            raise DemoFailed(f"stage '{self.name}' failed: {exc}") from exc
