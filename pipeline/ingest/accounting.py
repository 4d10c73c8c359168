"""Exact accounting of one run: every record read is valid, quarantined or a duplicate.

``read = valid + quarantined + duplicates`` per topic is checked here before anything is
committed, and the figures go into the run manifest (``<raw>/_runs/<run_id>.json``).

``orphan_labels`` is not a fourth bucket but a count *among the valid labels*: labels whose
transaction is neither in the raw store nor landed by this run (see :mod:`pipeline.ingest.orphans`).
They are kept, since their transaction may still come, so they stay inside ``valid``, and the raw
store holds exactly ``valid`` rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pipeline.contract import Kind, RejectReason
from pipeline.ingest.offsets import OffsetPlan


class AccountingError(RuntimeError):
    """The counts do not add up: a record was lost or counted twice. Nothing was committed."""


@dataclass(frozen=True)
class TopicAccounting:
    """What one run did with one topic's records."""

    topic: str
    kind: str
    read: int
    valid: int
    duplicates: int
    quarantined: dict[str, int]  # RejectReason value -> count (duplicates not included)
    offset_span: int  # sum of end - start over the planned ranges (== read on topics without gaps)
    ranges: dict[str, list[int]] = field(default_factory=dict)  # partition -> [start, end)
    lost: dict[str, int] = field(default_factory=dict)  # partition -> records skipped (allow_data_loss)
    orphan_labels: int = 0  # among ``valid`` (labels only): no transaction for them in the raw store yet

    @property
    def quarantined_total(self) -> int:
        return sum(self.quarantined.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "quarantined_total": self.quarantined_total}


def merge_summaries(chunks) -> tuple[dict[int, int], dict[str | None, int], dict[int, int]]:
    """Combine the read tasks' :class:`pipeline.ingest.landing.ChunkSummary` rows into
    ``({partition: records read}, {reject_reason or None: rows}, {partition: watermark (us)})``."""
    read: dict[int, int] = {}
    outcomes: dict[str | None, int] = {}
    watermarks: dict[int, int] = {}
    for c in chunks:
        read[c.partition] = read.get(c.partition, 0) + c.read
        for reason, n in c.outcomes.items():
            key = None if reason == "valid" else reason
            outcomes[key] = outcomes.get(key, 0) + n
        if c.watermark is not None:
            watermarks[c.partition] = max(c.watermark, watermarks.get(c.partition, c.watermark))
    return read, outcomes, watermarks


def account(plan: OffsetPlan, kind: str, read_by_partition: dict[int, int], outcomes: dict[str | None, int],
            duplicates: int, orphan_labels: int = 0) -> TopicAccounting:
    """Checked accounting of one topic. ``outcomes`` are counted before duplicates were marked;
    ``duplicates`` (distinct Kafka positions, all among the accepted records) move from valid;
    ``orphan_labels`` are counted among what stays valid."""
    unknown = set(outcomes) - {None} - {r.value for r in RejectReason}
    if unknown:
        raise AccountingError(f"{plan.topic}: unknown outcome(s) {sorted(unknown)}")
    read = sum(read_by_partition.values())
    if read != sum(outcomes.values()):
        raise AccountingError(f"{plan.topic}: {read} records read but {sum(outcomes.values())} outcomes counted")
    accepted = outcomes.get(None, 0)
    if duplicates > accepted:
        raise AccountingError(f"{plan.topic}: {duplicates} duplicates among only {accepted} accepted records")
    if orphan_labels and (kind != Kind.LABEL.value or orphan_labels > accepted - duplicates):
        raise AccountingError(f"{plan.topic}: {orphan_labels} orphan labels among {accepted - duplicates} "
                              f"valid {kind}s: only kept labels can be orphans")
    spans = {r.partition: r.count for r in plan.ranges}
    over = {p: n for p, n in read_by_partition.items() if n > spans.get(p, 0)}
    if over:
        raise AccountingError(f"{plan.topic}: read more records than the planned offsets hold in partitions "
                              f"{sorted(over)}: some offsets were read twice")
    return TopicAccounting(
        topic=plan.topic, kind=kind, read=read, valid=accepted - duplicates, duplicates=duplicates,
        quarantined={r: n for r, n in sorted(outcomes.items(), key=lambda kv: str(kv[0])) if r is not None},
        offset_span=plan.records, ranges={str(r.partition): [r.start, r.end] for r in plan.ranges},
        lost={str(p): n for p, n in plan.lost.items()}, orphan_labels=orphan_labels,
    )


def verify_landed(accounting: TopicAccounting, raw_rows: int, quarantine_rows: int) -> None:
    """What the run's files hold must match the accounting exactly: valid rows in the raw store,
    quarantined and duplicate rows in the quarantine table."""
    expected_quarantine = accounting.quarantined_total + accounting.duplicates
    if raw_rows != accounting.valid or quarantine_rows != expected_quarantine:
        raise AccountingError(
            f"{accounting.topic}: wrote {raw_rows} raw rows and {quarantine_rows} quarantine rows, expected "
            f"{accounting.valid} and {expected_quarantine}; nothing was committed, rerun the job")
