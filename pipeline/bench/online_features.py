"""What one payment costs the online features, and whether a big merchant costs more.

:func:`measure` fills an :class:`pipeline.features.online.OnlineFeatureState` with 30 days of
payments, then times each new payment as the scoring service handles it (remembered, then its
features asked: :meth:`pipeline.serving.features.FeatureStore.score_features_many` without the lock),
in event-time order:

* ``online_feature_us_p50``, ``online_feature_us_p99``: ordinary payments (random cards and
  merchants of the filled population). This bench owns these two fields; the ingest bench times the
  same operation (:func:`time_payment`) over its replayed simulation and reports it under its own
  name (``replay_feature_us_p50/p99``);
* ``online_big_merchant_ratio``: p99 of payments at a merchant holding ``big_merchant_payments``
  payments in its 30-day window (1 M; 20 k in quick mode) over p99 of payments at one that starts
  with 100, the two timed alternately so that they share the machine's moods. Goal: at most 2 (the
  cost of a payment does not grow with its merchant's history). Each timed payment joins its
  merchant's window, so the small one ends holding 100 + the timed payments (20 k; 2 k in quick mode):
  ``big_merchant_window`` and ``small_merchant_window`` report the windows the timings saw.

The heap is frozen out of the GC after the fill, as the service does once seeded
(``[server] freeze_heap``), so a full collection of the filled state does not land in one timing.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable

import numpy as np

from pipeline.features.kernel import US_PER_DAY
from pipeline.features.online import OnlineFeatureState, Payment
from pipeline.features.params import FeatureParams

START_US = 1_772_323_200_000_000  # 2026-03-01T00:00:00Z: the timed payments start here
WINDOW_US = 30 * US_PER_DAY
# (ordinary fill payments, cards, merchants, big merchant's payments, timed payments per measure)
SIZES = {False: (200_000, 20_000, 2_000, 1_000_000, 20_000), True: (20_000, 2_000, 200, 20_000, 2_000)}
SMALL_MERCHANT_PAYMENTS = 100


def _payment(rng: random.Random, tid: str, card: int, merchant: str, ts_us: int) -> Payment:
    return Payment(tid, f"card-{card}", merchant, ts_us, round(rng.uniform(1, 400), 2),
                   rng.choice(("5411", "5812", "4829")), "ecommerce", rng.choice(("DE", "FR", "US")))


def _fill(state: OnlineFeatureState, rng: random.Random, payments: int, cards: int, merchant: Callable[[], str],
          prefix: str) -> None:
    """``payments`` payments of random cards at ``merchant()`` over the 30 days before START_US, in time order,
    one fraud report per 200."""
    times = np.sort(np.array([rng.randrange(START_US - WINDOW_US, START_US) for _ in range(payments)], dtype=np.int64))
    for i, ts in enumerate(times.tolist()):
        state.observe_payment(_payment(rng, f"{prefix}{i}", rng.randrange(cards), merchant(), ts))
        if i % 200 == 0:
            state.observe_label(f"{prefix}{i}", True, ts + US_PER_DAY)


def time_payment(state: OnlineFeatureState, payment: Payment) -> tuple[float, dict[str, float]]:
    """(microseconds, features) for ``payment`` as the scoring service handles it: remembered, then its
    features asked. The one timed operation of every online-feature figure (this bench's and ingest's replay)."""
    started = time.perf_counter_ns()
    state.observe_payment(payment)
    features = state.features(payment)
    return (time.perf_counter_ns() - started) / 1000, features


def percentiles(micros: list[float]) -> tuple[float, float]:
    """(p50, p99) of ``micros`` (numpy's linear interpolation), rounded to 0.01 us."""
    p50, p99 = np.percentile(np.array(micros), [50, 99])
    return round(float(p50), 2), round(float(p99), 2)


def measure(quick: bool, seed: int = 0, sizes: tuple[int, int, int, int, int] | None = None) -> dict:
    """The online feature cost per payment (see the module docstring); ``sizes`` overrides
    :data:`SIZES` (tests run a tiny one)."""
    fill, cards, merchants, big, timed = sizes or SIZES[quick]
    rng = random.Random(seed)
    state = OnlineFeatureState(FeatureParams())
    started = time.perf_counter()
    _fill(state, rng, fill, cards, lambda: f"m{rng.randrange(merchants)}", "o")
    _fill(state, rng, big, cards, lambda: "big", "b")
    _fill(state, rng, SMALL_MERCHANT_PAYMENTS, cards, lambda: "small", "s")
    fill_s = time.perf_counter() - started
    gc.collect()
    gc.freeze()
    try:
        step = 60 * 1_000_000 // 3  # three payments a minute after the fill: the windows keep sliding
        ordinary = [time_payment(state, _payment(rng, f"t{i}", rng.randrange(cards), f"m{rng.randrange(merchants)}",
                                                 START_US + i * step))[0] for i in range(timed)]
        at: dict[str, list[float]] = {"big": [], "small": []}
        held: dict[str, list[float]] = {"big": [], "small": []}  # the merchant's 30-day count each payment saw
        for i in range(timed):
            for merchant in ("big", "small"):
                ts = START_US + (timed + i) * step
                micros, features = time_payment(state, _payment(rng, f"{merchant}{i}", rng.randrange(cards),
                                                                merchant, ts))
                at[merchant].append(micros)
                held[merchant].append(features["merchant_tx_count_30d"])
    finally:
        gc.unfreeze()
    p50, p99 = percentiles(ordinary)
    (big_p50, big_p99), (small_p50, small_p99) = percentiles(at["big"]), percentiles(at["small"])
    return {"online_feature_us_p50": p50, "online_feature_us_p99": p99,
            "online_big_merchant_ratio": round(big_p99 / small_p99, 3),
            "big_merchant_us_p99": big_p99, "small_merchant_us_p99": small_p99,
            # The medians too: on a shared machine a p99 of a few thousand timings is mostly preemptions.
            "big_merchant_us_p50": big_p50, "small_merchant_us_p50": small_p50,
            "big_merchant_payments": big, "small_merchant_payments": SMALL_MERCHANT_PAYMENTS,
            # What the ratio compares: the merchants' 30-day windows as the timed payments found them
            # (min, max; the fill's oldest payments leave as the clock moves), and how many were timed.
            "big_merchant_window": [min(held["big"]), max(held["big"])],
            "small_merchant_window": [min(held["small"]), max(held["small"])],
            "big_merchant_timed": len(at["big"]), "small_merchant_timed": len(at["small"]),
            "fill_payments": fill + big + SMALL_MERCHANT_PAYMENTS, "timed_payments": timed,
            "fill_s": round(fill_s, 1), "state": state.size()}
