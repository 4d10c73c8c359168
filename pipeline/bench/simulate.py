"""Simulator throughput against the >= 100k events/s requirement, plus JSONL serialisation rate.

Generation is timed cold (population cache cleared) and warm (a second window of the same
seed, as in nightly runs); ``events_per_s`` is the cold figure, the conservative one.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

from pipeline.simulation import SimulationConfig, simulate
from pipeline.simulation import simulator as simulator_module
from pipeline.simulation.io import write_jsonl

TARGET_EVENTS_PER_S = 100_000


def run(quick: bool) -> dict:
    # ~1.5 payments per card-day: 120k cards x 3 days ~ 540k events; quick ~ 110k.
    config = SimulationConfig(seed=1, start_date="2026-01-01", days=3, num_cards=25_000 if quick else 120_000,
                              num_merchants=5_000)
    simulator_module._population.cache_clear()
    started = time.perf_counter()
    sim = simulate(config)
    cold_s = time.perf_counter() - started

    started = time.perf_counter()
    warm = simulate(dataclasses.replace(config, start_date="2026-01-04"))
    warm_s = time.perf_counter() - started

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        write_jsonl(sim.transaction_records(), Path(tmp) / "transactions.jsonl")
        jsonl_s = time.perf_counter() - started

    events = len(sim.transactions)
    events_per_s = events / cold_s
    return {
        "events": events,
        "fraud_events": int(sim.truth["is_fraud"].sum()),
        "events_per_s": round(events_per_s),
        "warm_events_per_s": round(len(warm.transactions) / warm_s),
        "jsonl_events_per_s": round(events / jsonl_s),
        "target_events_per_s": TARGET_EVENTS_PER_S,
        "ratio": round(events_per_s / TARGET_EVENTS_PER_S, 2),
    }
