"""Kafka -> raw store for one run: plan offsets, land (read, validate, screen, write), settle
copies, count orphan labels, check the accounting, commit.

Order of effects (what makes a SIGKILL at any point safe):
1. discard files of runs that never committed and unlisted identity-index segments; build the
   index once for a store that predates it (:mod:`pipeline.ingest.index_build`);
2. plan ``[committed, end)`` per partition, end taken once from ``pipeline.kafka.admin.end_offsets``;
3. per topic: the Kafka read tasks write accepted and refused records under this run's id
   (invisible so far); then copies of events already in the store (found shard by shard of the
   identity index, :mod:`pipeline.ingest.store_copies`) and of each other within this run become
   duplicates, late or not (:mod:`pipeline.ingest.run_copies`);
   labels whose transaction is in neither the store nor this run are counted. The labels are read while the transactions' copies
   are settled, and settled after them;
4. check that the files hold exactly what was accounted, write the run's identity-index segments
   (unlisted so far) and the run manifest;
5. commit: one atomic replace of the offset file adds the run id, offsets, watermarks and the
   live index segments; segments the commit replaced are then deleted.
"""

from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from pipeline.contract import Kind
from pipeline.ingest.accounting import (
    TopicAccounting,
    account,
    merge_summaries,
    verify_landed,
)
from pipeline.ingest.config import IngestConfig
from pipeline.ingest.index_build import build_missing_index
from pipeline.ingest.kafka_source import read_kafka
from pipeline.ingest.landing import ChunkSummary, landing_transform, parse_summaries
from pipeline.ingest.offsets import OffsetPlan, plan_offset_ranges
from pipeline.ingest.orphans import count_orphan_labels
from pipeline.ingest.progress import Progress
from pipeline.ingest.raw_layout import TABLE_BY_KIND, RawStore
from pipeline.ingest.run_copies import RunCopies, settle_copies
from pipeline.ingest.store_copies import StoreLookup
from pipeline.ingest.timing import LATENESS_SCREENED, TimingRules
from pipeline.kafka.admin import end_offsets
from pipeline.kafka.settings import KafkaConfig


@dataclass(frozen=True)
class IngestRun:
    """What every step of one run shares: where it writes, with which settings, under which id.
    Built once the store is locked (``ordinal`` is then this run's place in the commit log)."""

    spark: SparkSession
    store: RawStore
    config: IngestConfig
    kafka: KafkaConfig
    run_id: str
    started: datetime
    ordinal: int
    allow_data_loss: bool
    progress: Progress

    @staticmethod
    def begin(spark: SparkSession, store: RawStore, config: IngestConfig, kafka: KafkaConfig, run_id: str,
              allow_data_loss: bool, progress: Progress) -> IngestRun:
        """The run starting now; call with the store locked (no other run commits before this one)."""
        return IngestRun(spark, store, config, kafka, run_id, datetime.now(UTC), len(store.committed().runs),
                         allow_data_loss, progress)


@dataclass(frozen=True)
class IngestResult:
    run_id: str
    accounting: tuple[TopicAccounting, ...]
    run_manifest: str


@dataclass(frozen=True)
class LandedTopic:
    accounting: TopicAccounting
    watermarks: dict[int, int]  # partition -> latest accepted event time (epoch us)
    copies: RunCopies  # what stays valid, as identity-index entries


def topics_by_kind(kafka: KafkaConfig) -> dict[Kind, str]:
    return {Kind.TRANSACTION: kafka.transactions_topic, Kind.LABEL: kafka.labels_topic}


def plan_run(store: RawStore, kafka: KafkaConfig, allow_data_loss: bool) -> dict[Kind, OffsetPlan]:
    """Offset ranges this run reads, per event kind (talks to Kafka once per topic)."""
    committed = store.committed().offsets
    return {kind: plan_offset_ranges(topic, committed.get(topic, {}), end_offsets(kafka, topic), allow_data_loss)
            for kind, topic in topics_by_kind(kafka).items()}


def land_topic(run: IngestRun, plan: OffsetPlan, kind: Kind) -> list[ChunkSummary]:
    """Read, validate, screen and write one topic's planned ranges (in the read tasks)."""
    store, raw = run.store, run.config.raw
    # Unscreened kinds start from no watermark, so they report none and commit none.
    watermarks = store.committed().watermarks.get(plan.topic, {}) if kind in LATENESS_SCREENED else {}
    rules = TimingRules(raw.max_lateness_days, raw.max_clock_skew_s, int(run.started.timestamp() * 1_000_000),
                        watermarks)
    transform = landing_transform(kind, rules, run.run_id, store.root, raw.quarantine_duplicates)
    landed = read_kafka(run.spark, run.kafka, list(plan.ranges), run.config.source, run.allow_data_loss, transform)
    return parse_summaries(landed.collect())


@dataclass(frozen=True)
class _Landed:
    """One topic's read tasks' outcome, before its duplicates and accounting are checked."""

    read: dict
    outcomes: dict
    watermarks: dict[int, int]


def land(run: IngestRun, plan: OffsetPlan, kind: Kind) -> _Landed:
    """Land one topic's planned ranges under the run's id (a Spark job; nothing when nothing is planned)."""
    if plan.records == 0:  # nothing new: skip the Spark job, account zeros
        return _Landed({}, {}, {})
    with run.progress.stage(f"{kind.value}s: read + validate + land") as counts:
        read, outcomes, watermarks = merge_summaries(land_topic(run, plan, kind))
        counts.update(read=sum(read.values()), accepted=outcomes.get(None, 0),
                      quarantined=sum(n for r, n in outcomes.items() if r is not None))
    return _Landed(read, outcomes, watermarks)


def check_landed(run: IngestRun, plan: OffsetPlan, kind: Kind, landed: _Landed,
                 transactions: LandedTopic | None = None) -> LandedTopic:
    """Settle the landed topic's copies, count orphan labels, check the accounting (on the driver).
    Labels need this run's ``transactions`` checked first."""
    if plan.records == 0:
        return LandedTopic(account(plan, kind.value, {}, {}), {}, RunCopies.none())
    store, raw = run.store, run.config.raw
    with run.progress.stage(f"{kind.value}s: duplicates + check") as counts:
        lookup = StoreLookup(run.spark if raw.index_lookup == "spark" else None, raw.index_lookup_tasks)
        copies = settle_copies(store, kind, run.run_id, run.ordinal, raw.quarantine_duplicates, lookup)
        orphans = count_orphan_labels(store.run_files(run.run_id, Kind.LABEL)[0], store.id_index(Kind.TRANSACTION),
                                      transactions.copies.kept.ids) if kind is Kind.LABEL else 0
        accounting = account(plan, kind.value, landed.read, landed.outcomes, copies.moves, orphans)
        verify_landed(accounting, *store.count_run_rows(run.run_id, kind), raw.quarantine_duplicates)
        counts.update(duplicates=accounting.duplicates, valid=accounting.valid)
        if copies.moves.conflicting:
            counts["conflicting_duplicates"] = copies.moves.conflicting
        if kind is Kind.LABEL:
            counts["orphan_labels"] = orphans
    return LandedTopic(accounting, landed.watermarks, copies)


def prepare_run(store: RawStore, kafka: KafkaConfig, allow_data_loss: bool, progress: Progress) -> dict[Kind, OffsetPlan]:
    """Steps 1-2 (no Spark needed: an unreachable broker fails before a session starts).
    Call with the store locked."""
    with progress.stage("prepare") as counts:
        counts["discarded_uncommitted"] = len(store.discard_uncommitted())
        if build_missing_index(store) is not None:
            counts["identity_index_built"] = 1
    with progress.stage("plan offsets") as counts:
        plans = plan_run(store, kafka, allow_data_loss)
        for plan in plans.values():
            counts[plan.topic] = plan.records
            if plan.lost:
                counts[f"{plan.topic}_lost"] = sum(plan.lost.values())
    return plans


def land_and_commit(run: IngestRun, plans: dict[Kind, OffsetPlan]) -> IngestResult:
    """Steps 3-5: land every planned range under the run's id, then commit. Call with the store locked."""
    tx, labels = plans[Kind.TRANSACTION], plans[Kind.LABEL]
    landed_tx = land(run, tx, Kind.TRANSACTION)
    # The labels' Spark job runs while the driver checks the transactions' duplicates (Arrow, mostly
    # without the GIL): the two overlap instead of queueing. Leaving the pool waits for the labels'
    # job, so a failed check never leaves it running; its files stay uncommitted (step 1 discards them).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="land-labels") as pool:
        landing_labels = pool.submit(contextvars.copy_context().run, land, run, labels, Kind.LABEL)
        checked_tx = check_landed(run, tx, Kind.TRANSACTION, landed_tx)
        landed_labels = landing_labels.result()
    # Counting orphan labels looks at this run's kept transactions.
    landed = {Kind.TRANSACTION: checked_tx, Kind.LABEL: check_landed(run, labels, Kind.LABEL, landed_labels, checked_tx)}
    accounting = tuple(t.accounting for t in landed.values())
    store, ordinal = run.store, run.ordinal
    with run.progress.stage("commit") as counts:
        manifest = store.write_run_manifest(run.run_id, {
            "run_id": run.run_id, "started_at": run.started.isoformat(), "bootstrap_servers": run.kafka.bootstrap_servers,
            "accounting": [a.to_dict() for a in accounting],
        })
        index = {TABLE_BY_KIND[kind]: store.id_index(kind).with_run(ordinal, t.copies.kept) for kind, t in landed.items()}
        committed = store.offsets.commit(run.run_id, list(plans.values()),
                                         {plans[kind].topic: t.watermarks for kind, t in landed.items()}, index)
        for kind in landed:  # the segments this commit merged away
            store.id_index(kind, committed.index[TABLE_BY_KIND[kind]]).discard_unlisted()
        store.discard_run_hashes(run.run_id)
        counts["run_manifest"] = manifest.name
    return IngestResult(run.run_id, accounting, str(manifest))
