"""Ingest-only timing rejections, ``FUTURE_EVENT_TIME`` and ``LATE_EVENT`` (pure Arrow).

These are decisions the contract cannot make from one record. They apply, in this order, to
records that passed contract validation:

* future: the event time is more than ``max_clock_skew_s`` ahead of the record's Kafka timestamp
  (when the producer created it or the broker appended it; the run's start when Kafka has none);
* late, transactions only: the event time is more than ``max_lateness_days`` behind the
  partition's watermark, the latest event time among accepted records at earlier offsets of the
  same topic partition (this run's, and those committed by earlier runs). That is
  stream-processing lateness: ordinary out-of-order delivery is tolerated, and neither the
  producer's timestamps nor the date a backfill runs matter, so replaying history is not "late".
  Future events are refused first, so one far-future timestamp cannot drag the watermark ahead.

Labels are never late (:data:`LATENESS_SCREENED`): a chargeback is valid whenever it arrives, and
refusing one would turn a fraud into a genuine training example. They get no watermark.

The watermark needs records in offset order per partition: :func:`screen_timing` is applied to
the batches of one Kafka read task, in order (both Kafka sources read a partition range in
offset order), and raises if offsets go backwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract import TIME_FIELD_BY_KIND, Kind, RejectReason
from pipeline.ingest.validate import DETAIL, FIELD, REASON

NO_WATERMARK = -(2**62)  # below any real time, and far from int64 overflow when subtracted from
US_PER_DAY = 86_400 * 1_000_000
# Kinds the lateness rule applies to. Labels are absent on purpose (see the module doc).
LATENESS_SCREENED = frozenset({Kind.TRANSACTION})


@dataclass(frozen=True)
class TimingRules:
    max_lateness_days: float
    max_clock_skew_s: float
    run_started_us: int  # stands in for a missing Kafka timestamp
    committed_watermarks: dict[int, int] = field(default_factory=dict)  # partition -> epoch us

    @staticmethod
    def from_dict(d: dict) -> TimingRules:
        """Inverse of ``dataclasses.asdict`` after a JSON round trip (partition keys become strings)."""
        marks = {int(p): int(w) for p, w in d["committed_watermarks"].items()}
        return TimingRules(d["max_lateness_days"], d["max_clock_skew_s"], d["run_started_us"], marks)

    @property
    def lateness_us(self) -> int:
        return int(self.max_lateness_days * US_PER_DAY)

    @property
    def skew_us(self) -> int:
        return int(self.max_clock_skew_s * 1_000_000)


@dataclass
class ReadState:
    """Watermarks and last offsets of the partitions one read task has seen so far."""

    watermarks: dict[int, int]
    last_offsets: dict[int, int] = field(default_factory=dict)

    def watermark(self, partition: int) -> int | None:
        mark = self.watermarks.get(partition, NO_WATERMARK)
        return None if mark == NO_WATERMARK else mark


def _reject(table: pa.Table, mask: pa.Array, reason: RejectReason, field_name: str, detail: str) -> pa.Table:
    for column, value in ((REASON, reason.value), (FIELD, field_name), (DETAIL, detail)):
        marked = pc.if_else(mask, value, table[column].combine_chunks())
        table = table.set_column(table.schema.get_field_index(column), column, marked)
    return table


def _late_in_partition(times: pa.Array, accepted: pa.Array, offsets: pa.Array, partition: int,
                       rules: TimingRules, state: ReadState) -> pa.Array:
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    previous = state.last_offsets.get(partition)
    if (previous is not None and first <= previous) or not pc.all(pc.greater(offsets[1:], offsets[:-1]), min_count=0).as_py():
        raise RuntimeError(f"partition {partition}: offsets out of order near {first}; timing screen needs "
                           f"records in offset order (apply it directly to the Kafka read)")
    state.last_offsets[partition] = last
    mark = state.watermarks.get(partition, NO_WATERMARK)
    eligible = pc.fill_null(pc.if_else(accepted, times, NO_WATERMARK), NO_WATERMARK)
    running = pc.max_element_wise(pc.cumulative_max(eligible), mark)
    before = pc.max_element_wise(pa.concat_arrays([pa.array([mark], pa.int64()), running[:-1]]), mark)
    state.watermarks[partition] = running[-1].as_py()
    return pc.and_(accepted, pc.fill_null(pc.less(times, pc.subtract(before, rules.lateness_us)), False))


def screen_timing(table: pa.Table, kind: Kind, rules: TimingRules, state: ReadState) -> pa.Table:
    """Mark future records, and late ones of the kinds in :data:`LATENESS_SCREENED`, in one batch
    (columns: ``timestamp``, ``partition``, ``offset``, ``reject_reason``, ``reject_field``,
    ``reject_detail`` and the kind's time field). Only screened kinds touch ``state``."""
    if table.num_rows == 0:
        return table
    name = TIME_FIELD_BY_KIND[kind]
    times = pc.cast(table[name].combine_chunks(), pa.int64())
    kafka = pc.fill_null(pc.cast(table["timestamp"].combine_chunks(), pa.int64()), rules.run_started_us)
    accepted = pc.is_null(table[REASON].combine_chunks())
    # Rejected rows have no time (null): fill_null keeps comparisons with them False, never null.
    future = pc.and_(accepted, pc.fill_null(pc.greater(pc.subtract(times, kafka), rules.skew_us), False))
    table = _reject(table, future, RejectReason.FUTURE_EVENT_TIME, name,
                    f"{name} is more than {rules.max_clock_skew_s:g} s ahead of the record's Kafka timestamp "
                    f"(of the run's start when the record has none)")
    if kind not in LATENESS_SCREENED:
        return table
    accepted = pc.and_(accepted, pc.invert(future))
    partitions = table["partition"].combine_chunks()
    offsets = table["offset"].combine_chunks()
    late_positions = []
    for p in pc.unique(partitions).to_pylist():
        idx = pc.indices_nonzero(pc.equal(partitions, p))
        late = _late_in_partition(times.take(idx), accepted.take(idx), offsets.take(idx), p, rules, state)
        late_positions.append(idx.filter(late))
    late_mask = pc.is_in(pa.array(range(table.num_rows), pa.uint64()), pa.concat_arrays(late_positions))
    return _reject(table, late_mask, RejectReason.LATE_EVENT, name,
                   f"{name} is more than {rules.max_lateness_days:g} days behind its partition's watermark "
                   f"(the latest accepted {name} at earlier offsets)")
