"""The feed's watch without a broker: out-of-range positions in ingest's words, stalls, recorded resets."""

from __future__ import annotations

import pytest

from pipeline.ingest.offsets import OffsetGapError, plan_offset_ranges
from pipeline.serving.stream_watch import StreamWatch, describe_gap, find_offset_gap
from tests.serving.conftest import FakeClock

TX = ("transactions", 0)


@pytest.mark.parametrize(("position", "low", "high"), [(0, 0, 0), (3, 0, 7), (7, 0, 7), (5, 5, 9)])
def test_a_position_within_the_partition_or_at_its_end_is_no_gap(position, low, high):
    assert find_offset_gap(TX, position, low, high) is None


def test_a_position_beyond_the_end_is_a_gap_in_ingests_words_with_its_remedy():
    gap = find_offset_gap(TX, 56760, 0, 1583)
    assert (gap.position, gap.low, gap.high) == (56760, 0, 1583)
    assert "the committed offset 56760 is beyond the end 1583" in gap.detail
    with pytest.raises(OffsetGapError) as ingest:  # what the ingest job says for the same offsets
        plan_offset_ranges("transactions", {0: 56760}, {0: (0, 1583)})
    assert gap.detail == str(ingest.value) and "--allow-data-loss" in gap.detail


def test_a_position_before_the_start_is_a_gap_and_the_policy_says_what_follows():
    gap = find_offset_gap(TX, 10, 40, 90)
    assert "records 10..39 were deleted by retention" in gap.detail
    assert describe_gap(gap, "earliest").endswith('resumes transactions[0] from offset 40 (stream.on_offset_gap = '
                                                  '"earliest").')
    assert "will not return to offset 10" in describe_gap(gap, "wait")
    beyond = find_offset_gap(TX, 100, 0, 20)
    waiting = describe_gap(beyond, "wait")
    assert waiting.startswith(f"event feed: {beyond.detail}.")
    assert 'waits until transactions[0] reaches offset 100 (stream.on_offset_gap = "wait"' in waiting


def test_a_gap_holds_while_the_live_position_is_the_one_judged():
    watch = StreamWatch(stall_after_s=60, clock=FakeClock())
    gaps = watch.observe({TX: 100, ("labels", 0): 3}, {TX: (0, 20), ("labels", 0): (0, 3)})
    assert [(g.topic, g.partition, g.position) for g in gaps] == [("transactions", 0, 100)]
    assert watch.has_gap(TX) and not watch.has_gap(("labels", 0))
    assert len(watch.report({TX: 100}).gaps) == 1
    assert watch.report({TX: 101}).gaps == []  # the topic reached it and the feed moved on
    assert watch.observe({TX: 101}, {TX: (0, 120)}) == [] and not watch.has_gap(TX)


def test_a_position_that_stays_put_while_the_end_grows_stalls_after_the_configured_time():
    clock = FakeClock()
    watch = StreamWatch(stall_after_s=60, clock=clock)
    watch.observe({TX: 50}, {TX: (0, 50)})  # caught up
    clock.advance(600)  # an idle topic: nothing to read is no stall
    watch.observe({TX: 50}, {TX: (0, 50)})
    clock.advance(30)
    watch.observe({TX: 50}, {TX: (0, 80)})  # the topic grows, the position does not move
    assert watch.report({TX: 50}).stalls == []
    clock.advance(31)
    watch.observe({TX: 50}, {TX: (0, 95)})
    [stall] = watch.report({TX: 50}).stalls
    assert (stall.position, stall.high_before, stall.high, stall.lag, stall.stalled_s) == (50, 50, 95, 45, 61)
    assert "has stayed at offset 50 for 61s while its end grew from 50 to 95 (lag 45)" in stall.reason()
    assert watch.report({TX: 51}).stalls == []  # any progress ends it at once


def test_a_feed_catching_up_a_backlog_is_not_stalled():
    clock = FakeClock()
    watch = StreamWatch(stall_after_s=60, clock=clock)
    for position in range(0, 1000, 100):
        watch.observe({TX: position}, {TX: (0, 5000 + position)})
        clock.advance(30)
    assert watch.report({TX: 900}).stalls == []


def test_resets_are_counted_with_the_records_known_lost():
    watch = StreamWatch(stall_after_s=60, clock=FakeClock())
    [retention] = watch.observe({TX: 10}, {TX: (40, 90)})
    watch.record_reset(retention, 40)
    [recreated] = watch.observe({TX: 90}, {TX: (0, 5)})
    watch.record_reset(recreated, 0)
    report = watch.report({TX: 0})
    assert [(r.from_offset, r.to_offset, r.skipped) for r in report.resets] == [(10, 40, 30), (90, 0, 0)]
    assert report.resets_total == {TX: 2} and report.skipped_total == {TX: 30}
    assert report.gaps == [] and report.resets[1].detail == recreated.detail


def test_a_failed_probe_is_reported_and_keeps_the_last_judgement():
    watch = StreamWatch(stall_after_s=60, clock=FakeClock())
    watch.observe({TX: 100}, {TX: (0, 20)})
    watch.probe_failed("KafkaUnavailable: no broker")
    report = watch.report({TX: 100})
    assert report.error == "KafkaUnavailable: no broker" and len(report.gaps) == 1
