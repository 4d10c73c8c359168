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
    """The counts do not add up: a record was lost or counted twice. Nothing was committed.

    The counts and the files are derived from the same classification, so this is a bug in ingest,
    not a problem with the data: a rerun reads the same records and fails the same way."""


REPORT_IT = ("nothing was committed; this is a bug in ingest, not in the data, and a rerun will fail the same "
             "way: report it with this message and the run manifest's run id")


@dataclass(frozen=True)
class CopyMoves:
    """How settling copies (pipeline.ingest.run_copies) changed the read tasks' verdicts, in rows."""

    valid_to_duplicate: int = 0
    valid_to_conflicting: int = 0
    late_to_duplicate: int = 0
    late_to_conflicting: int = 0

    @property
    def duplicates(self) -> int:
        return self.valid_to_duplicate + self.late_to_duplicate

    @property
    def conflicting(self) -> int:
        return self.valid_to_conflicting + self.late_to_conflicting


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
            moves: CopyMoves = CopyMoves(), orphan_labels: int = 0) -> TopicAccounting:
    """Checked accounting of one topic. ``outcomes`` are the read tasks' verdicts (None: valid;
    identical copies of stored events count as ``duplicates``, not as a quarantine reason);
    ``moves`` (:func:`pipeline.ingest.run_copies.settle_copies`) turn valid and late records into
    copies of each other: identical ones leave for ``duplicates``, conflicting ones for that
    quarantine reason; ``orphan_labels`` are counted among what stays valid."""
    unknown = set(outcomes) - {None} - {r.value for r in RejectReason}
    if unknown:
        raise AccountingError(f"{plan.topic}: unknown outcome(s) {sorted(unknown)}; {REPORT_IT}")
    read = sum(read_by_partition.values())
    if read != sum(outcomes.values()):
        raise AccountingError(f"{plan.topic}: {read} records read but {sum(outcomes.values())} outcomes counted; "
                              f"{REPORT_IT}")
    late, conflicting = RejectReason.LATE_EVENT.value, RejectReason.CONFLICTING_DUPLICATE.value
    duplicate = RejectReason.DUPLICATE.value
    accepted = outcomes.get(None, 0)
    valid = accepted - moves.valid_to_duplicate - moves.valid_to_conflicting
    if valid < 0 or outcomes.get(late, 0) < moves.late_to_duplicate + moves.late_to_conflicting:
        raise AccountingError(f"{plan.topic}: more copies ({moves}) than accepted ({accepted}) or late records; "
                              f"{REPORT_IT}")
    if orphan_labels and (kind != Kind.LABEL.value or orphan_labels > valid):
        raise AccountingError(f"{plan.topic}: {orphan_labels} orphan labels among {valid} "
                              f"valid {kind}s: only kept labels can be orphans; {REPORT_IT}")
    quarantined = {r: n for r, n in outcomes.items() if r not in (None, duplicate)}
    quarantined[late] = quarantined.get(late, 0) - moves.late_to_duplicate - moves.late_to_conflicting
    quarantined[conflicting] = quarantined.get(conflicting, 0) + moves.conflicting
    quarantined = {r: n for r, n in sorted(quarantined.items()) if n}
    spans = {r.partition: r.count for r in plan.ranges}
    over = {p: n for p, n in read_by_partition.items() if n > spans.get(p, 0)}
    if over:
        raise AccountingError(f"{plan.topic}: read more records than the planned offsets hold in partitions "
                              f"{sorted(over)}: some offsets were read twice; {REPORT_IT}")
    return TopicAccounting(
        topic=plan.topic, kind=kind, read=read, valid=valid, duplicates=outcomes.get(duplicate, 0) + moves.duplicates,
        quarantined=quarantined,
        offset_span=plan.records, ranges={str(r.partition): [r.start, r.end] for r in plan.ranges},
        lost={str(p): n for p, n in plan.lost.items()}, orphan_labels=orphan_labels,
    )


def verify_landed(accounting: TopicAccounting, raw_rows: int, quarantine_rows: int,
                  duplicates_quarantined: bool = True) -> None:
    """What the run's files hold must match the accounting exactly: valid rows in the raw store,
    quarantined rows (and identical duplicates, when they are kept) in the quarantine table."""
    expected_quarantine = accounting.quarantined_total + (accounting.duplicates if duplicates_quarantined else 0)
    if raw_rows != accounting.valid or quarantine_rows != expected_quarantine:
        raise AccountingError(
            f"{accounting.topic}: wrote {raw_rows} raw rows and {quarantine_rows} quarantine rows, expected "
            f"{accounting.valid} and {expected_quarantine}; {REPORT_IT}")
