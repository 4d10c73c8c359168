"""The online running windows equal the offline kernel on random streams, whatever order events arrive in.

Each payment is scored as the service scores it (remembered, then its features asked) the moment it
arrives, and compared with the kernel's row (:func:`pipeline.features.frame.build_feature_frame`)
over everything that had arrived by then. Streams have ties, same-instant payments of one card,
late payments (up to ingest's 7-day lateness bound behind the stream, which the service's expiry
margin covers), reports before their payment, an earlier report arriving after a later one,
clearing reports, and expiry running in between.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipeline.features import definitions as fd
from pipeline.features.kernel import US_PER_DAY, to_cents
from pipeline.features.online import OnlineFeatureState, Payment, cents_of
from pipeline.features.params import FeatureParams
from tests.features.kernel_oracle import kernel_row

T0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z, microseconds
H = 3600 * 1_000_000
# Payments arrive at most this far behind the latest one (ingest.toml's [raw] max_lateness_days, which
# the service's expiry margin must cover); expiry keeps it.
MARGIN = 7 * US_PER_DAY
PARAMS = FeatureParams(label_delay_hours=6, label_match_days=12)
AMOUNTS = (0.0, 0.004, 0.005, 0.015, 1.0, 9.99, 12.345, 250.0, 4999.99, 1e6)


def _payments(rng: random.Random, n: int, span_days: int) -> list[Payment]:
    out = []
    for i in range(n):
        at = T0 + rng.randint(0, span_days * 48) * H // 2  # half-hour grid: many ties
        out.append(Payment(f"p{i}", f"c{rng.randint(0, 5)}", f"m{rng.randint(0, 3)}", at,
                           rng.choice(AMOUNTS) if rng.random() < 0.3 else round(rng.uniform(0, 800), 2),
                           rng.choice(["5411", None]), "ecommerce", rng.choice(["DE", "FR", None])))
    burst = out[0]  # same-instant payments of one card, at one and at two merchants
    out += [Payment(f"same{i}", burst.card_id, f"m{i % 2}", burst.ts_us + 5 * H, 10.0 * i) for i in range(3)]
    return out


def _reports(rng: random.Random, payments: list[Payment]) -> list[tuple[str, bool, int]]:
    out = []
    for p in rng.sample(payments, len(payments) // 3):
        reported = p.ts_us + rng.randint(0, 16 * 24) * H  # some beyond label_match_days
        out.append((p.transaction_id, rng.random() < 0.8, reported))
        if rng.random() < 0.2:  # an earlier report of the same payment
            out.append((p.transaction_id, True, reported - rng.randint(1, 48) * H))
    out.append(("never-paid", True, T0 + 3 * US_PER_DAY))
    return out


def _arrivals(rng: random.Random, payments: list[Payment], reports: list) -> list[tuple[int, str, object]]:
    """Events in arrival order: payments up to MARGIN late, reports up to two days after their time
    (so an earlier report may come after a later one, and a report before its payment)."""
    timeline = [(p.ts_us + (rng.randint(0, MARGIN) if rng.random() < 0.3 else 0), "payment", p) for p in payments]
    timeline += [(r[2] + rng.randint(0, 2 * US_PER_DAY), "report", r) for r in reports]
    timeline.sort(key=lambda e: e[0])
    latest, ordered = -(2**62), []
    for arrival, kind, item in timeline:  # nothing arrives beyond the margin behind the latest payment
        if kind == "payment" and item.ts_us < latest - MARGIN:
            continue
        if kind == "payment":
            latest = max(latest, item.ts_us)
        ordered.append((arrival, kind, item))
    return ordered


def _kernel_row(payments: list[Payment], reports: list, transaction_id: str) -> dict:
    return kernel_row(payments, reports, PARAMS, transaction_id)


def _assert_rows_equal(online: dict, offline: dict, context: str) -> None:
    for name in fd.FEATURE_COLUMNS:
        assert online[name] == pytest.approx(float(offline[name]), rel=1e-9, abs=1e-9), (context, name)


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_scoring_in_arrival_order_equals_the_kernel_over_what_had_arrived(seed):
    rng = random.Random(seed)
    payments = _payments(rng, 160, 40)
    state = OnlineFeatureState(PARAMS)
    arrived: list[Payment] = []
    reported: list = []
    latest = -(2**62)
    checked = 0
    for step, (_, kind, item) in enumerate(_arrivals(rng, payments, _reports(rng, payments))):
        if kind == "report":
            state.observe_label(*item)
            reported.append(item)
            continue
        arrived.append(item)
        latest = max(latest, item.ts_us)
        state.observe_payment(item)
        online = state.features(item)
        _assert_rows_equal(online, _kernel_row(arrived, reported, item.transaction_id), item.transaction_id)
        checked += 1
        if step % 7 == 0:  # an earlier payment asked again: the cursors move back, then forward
            again = rng.choice([p for p in arrived if p.ts_us >= latest - MARGIN])
            _assert_rows_equal(state.features(again), _kernel_row(arrived, reported, again.transaction_id), "again")
        if step % 11 == 0:
            state.expire(latest - MARGIN)
    assert checked > 120
    assert state.size()["card_events"] < len(arrived)  # expiry did drop history on the way


def test_a_late_payment_changes_what_later_payments_see_and_nothing_before_it():
    state = OnlineFeatureState(PARAMS)
    for i in range(10):
        state.observe_payment(Payment(f"p{i}", "c", "m", T0 + i * H, 10.0 + i))
    late = Payment("late", "c", "m2", T0 + 4 * H + 1, 100.0)
    before = state.features(Payment("q", "c", "m", T0 + 4 * H, 1.0))
    after_before = state.features(Payment("q2", "c", "m", T0 + 20 * H, 1.0))
    state.observe_payment(late)
    assert state.features(Payment("q", "c", "m", T0 + 4 * H, 1.0)) == before
    after = state.features(Payment("q2", "c", "m", T0 + 20 * H, 1.0))
    assert after[fd.card_count(1)] == after_before[fd.card_count(1)] + 1
    assert after[fd.CARD_DISTINCT_MERCHANTS_1D] == 2 and after[fd.merchant_count(1)] == 10


def test_scalar_cents_equal_the_kernels():
    amounts = [*AMOUNTS, -1.0, float("nan"), float("inf"), 21_474_836.47, 21_474_836.48, 0.125, 2.675, 1.005]
    amounts += [random.Random(0).uniform(0, 10_000) for _ in range(2000)]
    assert [cents_of(a) for a in amounts] == to_cents(np.array(amounts)).tolist()


def test_an_earlier_report_after_expiry_dropped_the_first_ones_instant_changes_no_window():
    state = OnlineFeatureState(FeatureParams(label_delay_hours=6))  # payments matched for 90 days
    day = US_PER_DAY
    state.observe_payment(Payment("p", "c", "m", T0, 5.0))
    state.observe_label("p", True, T0 + 10 * day)
    state.observe_payment(Payment("q", "c2", "m", T0 + 45 * day, 5.0))
    assert state.expire(T0 + 45 * day) is True  # m's month now starts at day 15: the instant is gone
    state.observe_label("p", True, T0 + 9 * day)  # an earlier report of p: replaces a dropped instant
    row = state.features(Payment("r", "c3", "m", T0 + 45 * day + H, 5.0))
    assert (row[fd.merchant_count(30)], row[fd.merchant_fraud_rate(30)]) == (1.0, 0.0)
