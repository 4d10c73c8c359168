"""The service's feature store: exact event times, scored payments join the history, stream-time expiry."""

from __future__ import annotations

from pipeline.features import definitions as fd
from pipeline.serving.features import FeatureStore, micros, payment_from_event, warmup_rows
from tests.serving import factory

BASE = {"schema_version": 1, "merchant_id": "m-1", "currency": "EUR", "amount": 10, "country": "DE"}


def payment(tid: str, card: str, at: str, **fields):
    return payment_from_event({**BASE, "transaction_id": tid, "card_id": card, "event_time": at, **fields})


def test_event_times_are_exact_microseconds_in_any_offset():
    assert micros("2026-03-01T12:00:00.250001Z") == 1_772_366_400_250_001
    assert micros("2026-03-01T13:00:00.250001+01:00") == micros("2026-03-01T12:00:00.250001Z")
    assert payment("t", "c", "1970-01-01T00:00:00.000001Z").ts_us == 1
    assert isinstance(payment("t", "c", "2026-03-01T12:00:00Z").amount, float)  # JSON ints are amounts too


def test_a_scored_payment_is_history_for_the_next_and_rescoring_is_stable():
    store = FeatureStore(factory.PARAMS, expiry_margin_hours=24)
    first = store.score_features(payment("a", "c1", "2026-03-01T10:00:00Z"))
    second = store.score_features(payment("b", "c1", "2026-03-01T10:30:00Z", amount=30))
    assert (first[fd.card_count(1)], second[fd.card_count(1)], second[fd.CARD_TX_COUNT_1H]) == (0, 1, 1)
    assert store.score_features(payment("b", "c1", "2026-03-01T10:30:00Z", amount=30)) == second  # a retried request
    assert store.status()["payments"] == 2


def test_expiry_runs_on_stream_time_less_the_margin():
    store = FeatureStore(factory.PARAMS, expiry_margin_hours=24)
    store.observe_payment(payment("old", "c1", "2026-01-01T00:00:00Z"))
    store.observe_payment(payment("new", "c2", "2026-02-01T00:00:00Z"))
    late = payment("late", "c1", "2026-01-31T12:00:00Z")  # 12 h behind the stream: inside the margin
    before = store.features(late)
    store.expire()
    assert store.features(late) == before and store.status()["card_events"] == 2
    store.observe_payment(payment("newer", "c2", "2026-02-03T00:00:00Z"))
    store.expire()  # now c1's payment is more than 30 days + margin behind: gone
    assert store.status()["cards"] == 1 and store.features(late)[fd.card_count(30)] == 0


def test_warmup_rows_are_full_feature_rows():
    rows = warmup_rows(factory.PARAMS, 10)
    assert len(rows) == 10 and all(list(r) == list(fd.FEATURE_COLUMNS) for r in rows)
    assert max(r[fd.card_count(1)] for r in rows) > 0  # histories, not ten first payments
