"""The join of score events and fraud reports on hand-made topics: every record lands in one counted bucket."""

from __future__ import annotations

import json
from datetime import date, timedelta

import numpy as np
import pytest

from pipeline.monitoring.join import (
    Report,
    first_decisions,
    label_payments,
    parse_score_event,
    payment_accounting,
)
from pipeline.serving.features import micros
from tests.monitoring.events import records, rfc3339, score_event

DAY = date(2026, 3, 1)
CUTOFF_US = micros(rfc3339(DAY + timedelta(days=8), 0))  # end of DAY + 7


def topic():
    """Two partitions: duplicates, events out of order, other dates, junk, an event without thresholds."""
    e_late = score_event("tx-e", DAY, 0.30, at_s=43_200)  # 12:00, first by offset ...
    e_early = score_event("tx-e", DAY, 0.95, at_s=39_600)  # ... but decided first, at 11:00
    return records(
        (0, score_event("tx-b", DAY, 0.10, at_s=3000)),
        (0, score_event("tx-a", DAY, 0.90)),
        (0, score_event("tx-a", DAY, 0.10, at_s=3600, scored_after_s=30)),  # decided again, later
        (0, score_event("tx-z", DAY - timedelta(days=1), 0.50)),  # another day
        (0, b"not json"),
        (0, None),
        (0, json.dumps({**json.loads(score_event("tx-x", DAY, 0.5).to_json()), "score": 1.5}).encode()),
        (1, score_event("tx-c", DAY, 0.25, at_s=36_000)),  # 10:00
        (1, score_event("tx-d", DAY, 0.05, at_s=32_400)),  # 09:00 after 10:00: out of order
        (1, e_late),
        (1, e_early),  # out of order, and the decision that acted
        (1, score_event("tx-f", DAY, 0.70, at_s=50_000, review=None, block=None)),  # written before thresholds existed
    )


def test_each_event_read_is_used_or_counted_under_one_reason():
    decisions = first_decisions(topic(), DAY)
    a = decisions.accounting
    assert (a.read, a.used, a.duplicates, a.other_dates, a.unparseable, a.no_thresholds) == (12, 5, 2, 1, 3, 1)
    assert a.out_of_order == 2  # annotation: tx-d and the early tx-e, both used
    assert [p.transaction_id for p in decisions.payments] == ["tx-a", "tx-b", "tx-c", "tx-d", "tx-e"]
    assert decisions.without_thresholds == {"tx-f"} and decisions.other_dates == {"tx-z"}
    assert any("offset 4" in e and "not a score event" in e for e in a.examples["unparseable"])
    assert any("empty record value" in e for e in a.examples["unparseable"])
    assert any("score is not a probability" in e for e in a.examples["unparseable"])


def test_the_first_decision_by_the_services_clock_wins_over_topic_order():
    by_id = {p.transaction_id: p for p in first_decisions(topic(), DAY).payments}
    assert by_id["tx-e"].score == 0.95  # decided at 11:00, read after the 12:00 one
    assert by_id["tx-a"].score == 0.90  # the re-decision 30 s later is the duplicate
    assert (by_id["tx-a"].review_threshold, by_id["tx-a"].block_threshold) == (0.2, 0.8)


def test_a_day_without_events_uses_nothing_and_counts_the_rest():
    a = first_decisions(topic(), DAY + timedelta(days=5)).accounting
    assert (a.read, a.used, a.other_dates, a.unparseable) == (12, 0, 9, 3)


def test_the_latest_report_before_the_cutoff_decides_and_every_report_is_counted():
    decisions = first_decisions(topic(), DAY)
    at = micros(rfc3339(DAY + timedelta(days=2), 0))
    reports = [
        Report("tx-a", True, at),  # fraud
        Report("tx-b", True, at), Report("tx-b", False, at + 10),  # reported, then cleared: genuine
        Report("tx-c", True, CUTOFF_US),  # made at the cutoff: not mature knowledge of the day
        Report("tx-d", False, at), Report("tx-d", True, at),  # same instant: the fraud report wins
        Report("tx-z", True, at),  # a payment of another day
        Report("tx-f", True, at),  # its decision had no thresholds
        Report("tx-unknown", True, at),  # never scored
    ]
    labels, r = label_payments(decisions, reports, CUTOFF_US)
    assert dict(zip([p.transaction_id for p in decisions.payments], labels.tolist(), strict=True)) == {
        "tx-a": 1, "tx-b": 0, "tx-c": 0, "tx-d": 1, "tx-e": 0}
    assert (r.read, r.used, r.superseded, r.after_cutoff, r.other_dates, r.without_thresholds, r.never_scored) == (
        9, 3, 2, 1, 1, 1, 1)
    assert labels.dtype == np.int64


def test_payments_are_compared_with_the_raw_stores_payments_of_the_day():
    decisions = first_decisions(topic(), DAY)
    p = payment_accounting(decisions, ["tx-a", "tx-b", "tx-c", "tx-d", "tx-f", "tx-g"])
    assert (p.raw_store, p.decided, p.missing_decisions, p.not_in_raw_store) == (6, 5, 1, 1)  # tx-g; tx-e


@pytest.mark.parametrize(("change", "message"), [
    ({"model_version": "3"}, "model_version is not an integer"),
    ({"score": None}, "score is not a probability"),
    ({"review_threshold": 2.0}, "review_threshold is not a probability"),
    ({"event_time": "yesterday"}, "not an RFC 3339"),
    ({"features": [1, 2]}, "features is not an object"),
    ({"transaction_id": ""}, "transaction_id"),
])
def test_an_event_with_a_field_of_the_wrong_type_is_unparseable(change, message):
    body = {**json.loads(score_event("tx-a", DAY, 0.5).to_json()), **change}
    with pytest.raises(ValueError, match=message):
        parse_score_event(json.dumps(body).encode())


def test_an_event_missing_a_field_is_unparseable():
    body = json.loads(score_event("tx-a", DAY, 0.5).to_json())
    del body["score"]
    with pytest.raises(ValueError, match="not a score event"):
        parse_score_event(json.dumps(body).encode())
