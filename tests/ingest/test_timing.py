"""Future and late events: against the Kafka clock and the partition's watermark."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from pipeline.contract import Kind
from pipeline.ingest.timing import ReadState, TimingRules, screen_timing
from pipeline.ingest.validate import DETAIL, FIELD, REASON

DAY_US = 86_400 * 1_000_000


def us(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1_000_000)


def batch(events: list[tuple], partition: int = 0, first_offset: int = 0) -> pa.Table:
    """events: (event time or None for an already-rejected record, Kafka time or None)."""
    ts = pa.timestamp("us", tz="UTC")
    n = len(events)
    return pa.table({
        "partition": pa.array([partition] * n, pa.int32()),
        "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
        "timestamp": pa.array([k for _, k in events], pa.int64()).cast(ts),
        REASON: pa.array([None if e is not None else "malformed_json" for e, _ in events], pa.string()),
        FIELD: pa.nulls(n, pa.string()),
        DETAIL: pa.nulls(n, pa.string()),
        "event_time": pa.array([e for e, _ in events], pa.int64()).cast(ts),
    })


RULES = TimingRules(max_lateness_days=2, max_clock_skew_s=300, run_started_us=us("2026-03-01T00:00:00"))


def reasons(table: pa.Table) -> list:
    return table[REASON].to_pylist()


def test_event_ahead_of_its_kafka_timestamp_is_future():
    now = us("2026-01-10T12:00:00")
    out = screen_timing(batch([(now + 299_000_000, now), (now + 301_000_000, now), (now, None)]),
                        Kind.TRANSACTION, RULES, ReadState({}))
    assert reasons(out) == [None, "future_event_time", None]  # no Kafka time: the run clock (March) judges
    assert out[FIELD].to_pylist()[1] == "event_time"
    assert out[DETAIL].to_pylist() == [None, "event_time is more than 300 s ahead of the record's Kafka timestamp "
                                             "(of the run's start when the record has none)", None]


def test_late_means_behind_the_watermark_of_earlier_offsets():
    t = us("2026-01-10T00:00:00")
    events = [(t, None), (t - DAY_US, None), (t + 3 * DAY_US, None), (t, None), (t + DAY_US + 1, None), (None, None)]
    out = screen_timing(batch(events), Kind.TRANSACTION, RULES, ReadState({}))
    # watermark before each row: -, t, t, t+3d, t+3d, t+3d -> t is 3 days behind the 4th row's watermark
    assert reasons(out) == [None, None, None, "late_event", None, "malformed_json"]
    assert out[DETAIL].to_pylist()[3] == ("event_time is more than 2 days behind its partition's watermark "
                                          "(the latest accepted event_time at earlier offsets)")


def test_watermark_carries_across_batches_and_from_the_committed_state():
    t = us("2026-01-10T00:00:00")
    state = ReadState({0: t})
    first = screen_timing(batch([(t - 3 * DAY_US, None), (t + DAY_US, None)]), Kind.TRANSACTION, RULES, state)
    second = screen_timing(batch([(t - DAY_US, None), (t - DAY_US - 1, None)], first_offset=2),
                           Kind.TRANSACTION, RULES, state)
    assert reasons(first) == ["late_event", None]  # 3 days behind the committed watermark t
    # The first batch moved the watermark to t + 1d: exactly 2 days behind is allowed, 1us more is late.
    assert reasons(second) == [None, "late_event"]
    assert state.watermarks[0] == t + DAY_US


def test_rejected_and_future_records_never_move_the_watermark():
    t = us("2026-01-10T00:00:00")
    far = t + 100 * DAY_US
    state = ReadState({})
    out = screen_timing(batch([(t, t), (far, t), (t + 1, t)]), Kind.TRANSACTION, RULES, state)
    assert reasons(out) == [None, "future_event_time", None]
    assert state.watermarks[0] == t + 1


def test_partitions_have_their_own_watermarks():
    t = us("2026-01-10T00:00:00")
    table = pa.concat_tables([batch([(t + 10 * DAY_US, None)], partition=0), batch([(t, None)], partition=1)])
    out = screen_timing(table, Kind.TRANSACTION, RULES, ReadState({}))
    assert reasons(out) == [None, None]


def test_offsets_going_backwards_are_refused():
    t = us("2026-01-10T00:00:00")
    state = ReadState({})
    screen_timing(batch([(t, None), (t, None)], first_offset=10), Kind.TRANSACTION, RULES, state)
    with pytest.raises(RuntimeError, match="offsets out of order"):
        screen_timing(batch([(t, None)], first_offset=5), Kind.TRANSACTION, RULES, state)


def label_batch(events: list[tuple], first_offset: int = 0) -> pa.Table:
    return batch(events, first_offset=first_offset).rename_columns(
        ["partition", "offset", "timestamp", REASON, FIELD, DETAIL, "reported_at"])


def test_labels_are_never_late():
    # A chargeback weeks after newer reports on its partition (and behind a committed watermark) is
    # still a valid label: dropping it would turn a fraud into a genuine training example.
    t = us("2026-01-10T00:00:00")
    state = ReadState({0: t + 60 * DAY_US})
    out = screen_timing(label_batch([(t, None), (t - 30 * DAY_US, None), (t - 400 * DAY_US, None)]),
                        Kind.LABEL, RULES, state)
    assert reasons(out) == [None, None, None]
    assert state.watermarks == {0: t + 60 * DAY_US} and state.last_offsets == {}  # no watermark kept for labels


def test_labels_reported_in_the_future_are_judged_by_their_report_time():
    now = us("2026-01-10T12:00:00")
    out = screen_timing(label_batch([(now, now), (now + 301_000_000, now)]), Kind.LABEL, RULES, ReadState({}))
    assert reasons(out) == [None, "future_event_time"] and out[FIELD].to_pylist()[1] == "reported_at"
    assert out[DETAIL].to_pylist()[1].startswith("reported_at is more than 300 s ahead")
