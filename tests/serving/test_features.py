"""The service's feature store: exact event times, scored payments join the history, stream-time expiry,
ingest's timing rules on scored payments."""

from __future__ import annotations

import pytest

from pipeline.features import definitions as fd
from pipeline.ingest.config import RawStoreConfig
from pipeline.serving.config import TimeRulesConfig
from pipeline.serving.errors import PaymentRefused
from pipeline.serving.features import (
    FeatureStore,
    micros,
    payment_from_event,
    payment_time_rules,
    warmup_rows,
)
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


def test_a_batch_sees_its_own_earlier_payments_as_one_by_one_in_time_order():
    times = ["2026-03-01T10:30:00Z", "2026-03-01T10:00:00Z", "2026-03-01T10:30:00Z", "2026-03-01T11:00:00Z",
             "2026-03-01T09:00:00Z"]
    batch = [payment(f"t{i}", f"c{i % 2}", at, amount=10 + i, merchant_id=f"m-{i % 3}") for i, at in enumerate(times)]
    batch.append(batch[1])  # the same payment twice (a retried request)
    history = [payment(f"h{i}", f"c{i % 3}", f"2026-02-{10 + i:02d}T08:00:00Z", merchant_id="m-1") for i in range(10)]
    one_by_one, together = FeatureStore(factory.PARAMS, 24), FeatureStore(factory.PARAMS, 24)
    for store in (one_by_one, together):
        for p in history:
            store.observe_payment(p)
    expected = {p.transaction_id: one_by_one.score_features(p) for p in sorted(batch[:-1], key=lambda p: p.ts_us)}
    rows = together.score_features_many(batch)
    assert rows == [expected[p.transaction_id] for p in batch]
    # t3 (c1, 11:00) sees t1 (c1, 10:00) of the same batch; t0 (c0, 10:30) sees t4 (09:00), not t2 (10:30).
    assert (rows[3][fd.CARD_TX_COUNT_1H], rows[0][fd.card_count(1)], rows[0][fd.CARD_TX_COUNT_1H]) == (1, 1, 0)
    held = ("cards", "merchants", "payments", "card_events", "latest_event_time")
    assert {k: together.status()[k] for k in held} == {k: one_by_one.status()[k] for k in held}


def test_expiry_takes_the_lock_in_slices(monkeypatch):
    import pipeline.serving.features as features_module
    monkeypatch.setattr(features_module, "EXPIRE_SLICE", 3)
    monkeypatch.setattr(features_module, "EXPIRE_PAUSE_S", 0.0)
    store = FeatureStore(factory.PARAMS, expiry_margin_hours=0)
    calls = []
    expire = store._state.expire
    monkeypatch.setattr(store._state, "expire", lambda now, budget=None: calls.append(budget) or expire(now, budget))
    for i in range(20):
        store.observe_payment(payment(f"old{i}", f"c{i}", "2026-01-01T00:00:00Z"))
    store.observe_payment(payment("new", "c-new", "2026-03-01T00:00:00Z"))
    store.expire()
    assert store.status()["cards"] == 1 and store.expiries == 1
    assert set(calls) == {3} and len(calls) >= 20 // 3


def test_time_rules_are_ingests_bounds_against_the_clock_and_the_watermark():
    raw = RawStoreConfig(max_lateness_days=7.0, max_clock_skew_s=300.0)
    now, day, skew = micros("2026-03-01T12:00:00Z"), 86_400_000_000, 300_000_000
    by_watermark = payment_time_rules(TimeRulesConfig(), raw)
    by_clock = payment_time_rules(TimeRulesConfig(late_against="clock"), raw)
    never = payment_time_rules(TimeRulesConfig(late_against="off", future_against="off"), raw)

    def reason(rules, ts, watermark=None):
        rejection = rules.check(ts, watermark, now)
        return None if rejection is None else rejection.reason.value

    # Ingest's inequalities: more than the skew ahead, more than the lateness behind; the bounds pass.
    assert [reason(by_watermark, t) for t in (now + skew, now + skew + 1)] == [None, "future_event_time"]
    assert reason(by_watermark, now - 30 * day) is None  # no watermark yet: nothing is late
    assert [reason(by_watermark, now - 8 * day - d, now - day) for d in (0, 1)] == [None, "late_event"]
    assert [reason(by_clock, now - 7 * day - d) for d in (0, 1)] == [None, "late_event"]
    assert reason(by_clock, now + skew + 1, now) == "future_event_time"  # future first, as ingest
    assert reason(never, 1, now) is None and reason(never, now + 100 * day) is None


def test_a_refused_batch_leaves_the_store_as_it_was():
    now = micros("2026-03-01T12:00:00Z")
    store = FeatureStore(factory.PARAMS, 24, payment_time_rules(TimeRulesConfig(), RawStoreConfig()),
                         wall_clock=lambda: now / 1e6)
    store.score_features(payment("a", "c1", "2026-03-01T10:00:00Z"))
    before = store.status()
    with pytest.raises(PaymentRefused) as refused:
        store.score_features_many([payment("b", "c1", "2026-03-01T11:00:00Z"),
                                   payment("c", "c1", "9999-12-31T00:00:00Z")])
    assert (refused.value.index, refused.value.rejection.reason.value) == (1, "future_event_time")
    assert store.status() == before
    assert store.features(payment("d", "c1", "2026-03-01T11:30:00Z"))[fd.card_count(1)] == 1


# -- payments as late as ingest's bound are scored on their whole history -------------------------------

from dataclasses import replace  # noqa: E402

import pandas as pd  # noqa: E402

from pipeline.features.online import Payment  # noqa: E402
from pipeline.features.params import FeatureParams  # noqa: E402
from pipeline.ingest.config import load_ingest_config  # noqa: E402
from pipeline.serving.config import load_serving_config  # noqa: E402
from pipeline.serving.seed import seed_from_raw_store  # noqa: E402
from tests.features.kernel_oracle import kernel_row  # noqa: E402
from tests.monitoring.raw_store import write_raw_store  # noqa: E402

HOUR_US, DAY_US = 3_600_000_000, 86_400_000_000


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_payments_as_late_as_the_time_rules_accept_are_scored_on_their_whole_history(env):
    """The store as each checked-in config builds it (serving.toml's margin, ingest.toml's lateness
    bound and feature params), expiry run as the stream moves: a payment up to ``max_lateness_days``
    behind the latest one gets the row training builds over everything seen."""
    ingest, serving = load_ingest_config(env), load_serving_config(env)
    params, lateness_us = ingest.features, int(ingest.raw.max_lateness_days * DAY_US)
    start = micros("2026-01-01T00:00:00Z")
    store = FeatureStore(params, serving.stream.expiry_margin_hours,
                         payment_time_rules(replace(serving.time_rules, future_against="off"), ingest.raw))
    seen: list[Payment] = []
    reports: list[tuple[str, bool, int]] = []
    for i in range(300):  # 50 days, a payment every 4 h over 4 cards and 3 merchants
        seen.append(Payment(f"h{i}", f"c{i % 4}", f"m{i % 3}", start + i * 4 * HOUR_US, 10.0 + i % 37))
        store.score_features(seen[-1])
        if i >= 12 and (i - 12) % 7 == 0:  # every 7th payment reported as fraud 2 days (12 payments) on
            reports.append((seen[i - 12].transaction_id, True, seen[-1].ts_us))
            store.observe_label(*reports[-1])
        if i % 6 == 0:
            store.expire()
    latest = seen[-1].ts_us
    for k, behind in enumerate((DAY_US, 3 * DAY_US, lateness_us - HOUR_US, lateness_us)):
        store.expire()
        late = Payment(f"late{k}", f"c{k % 4}", f"m{k % 3}", latest - behind, 25.0)
        online = store.score_features(late)  # accepted by the time rules: not more than the bound behind
        seen.append(late)
        offline = kernel_row(seen, reports, params, late.transaction_id)
        for name in fd.FEATURE_COLUMNS:
            assert online[name] == pytest.approx(float(offline[name]), rel=1e-9, abs=1e-9), (behind / DAY_US, name)


def test_after_seeding_a_payment_as_late_as_the_margin_is_scored_on_its_whole_history(tmp_path):
    """The seed replays the raw store far enough back for a payment ``expiry_margin_hours`` behind the
    latest one, not only for the latest (a short label match, so that the card windows show it)."""
    params = FeatureParams(label_delay_hours=24.0, label_match_days=2)  # the seed reads 33 days for the latest
    start = micros("2026-01-01T00:00:00Z")
    history = [Payment(f"h{i}", f"c{i % 4}", f"m{i % 3}", start + i * 4 * HOUR_US, 10.0 + i % 37) for i in range(300)]
    reports = [(p.transaction_id, True, p.ts_us + DAY_US) for p in history[::7]]
    tx = pd.DataFrame({"transaction_id": [p.transaction_id for p in history], "card_id": [p.card_id for p in history],
                       "merchant_id": [p.merchant_id for p in history], "amount": [p.amount for p in history],
                       "event_time": pd.to_datetime([p.ts_us for p in history], unit="us", utc=True)})
    write_raw_store(tmp_path / "raw", tx, [(t, f, pd.Timestamp(r, unit="us", tz="UTC")) for t, f, r in reports])
    store = FeatureStore(params, expiry_margin_hours=168.0)
    assert seed_from_raw_store(store, tmp_path / "raw").payments < len(history)  # not simply the whole store
    late = Payment("late", "c1", "m1", history[-1].ts_us - 7 * DAY_US, 25.0)
    online = store.score_features(late)
    offline = kernel_row([*history, late], reports, params, late.transaction_id)
    for name in fd.FEATURE_COLUMNS:
        assert online[name] == pytest.approx(float(offline[name]), rel=1e-9, abs=1e-9), name
