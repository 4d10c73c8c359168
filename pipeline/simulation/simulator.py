"""``simulate(config) -> Simulation``: one window of card payments, fraud labels and ground truth.

Deterministic: the same config gives identical frames. The window's random stream is seeded
from ``(seed, start_date)``; the population from ``seed`` alone (see :mod:`.population`).
Transaction ids carry the start date and a fingerprint of the config, so windows simulated
with the same seed for different dates never share an id.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract import (
    KNOWN_CHANNELS,
    KNOWN_LABEL_SOURCES,
    LABEL_FIELDS,
    SCHEMA_VERSION,
    TRANSACTION_FIELDS,
)
from pipeline.simulation.blocks import MS_PER_DAY, NO_DEVICE, EventBlock, Window
from pipeline.simulation.config import (
    GENUINE,
    PATTERNS,
    PopulationConfig,
    SimulationConfig,
    config_fingerprint,
)
from pipeline.simulation.genuine import genuine_block
from pipeline.simulation.labels import LabelBlock, cleared_reports, false_reports, fraud_reports
from pipeline.simulation.patterns import GENERATORS, FraudContext
from pipeline.simulation.population import (
    COUNTRIES,
    COUNTRY_CURRENCY,
    CURRENCIES,
    MCC_CODES,
    Population,
    build_population,
    id_strings,
)
from pipeline.simulation.schedule import incident_days

TRANSACTION_COLUMNS = tuple(f.name for f in TRANSACTION_FIELDS)
LABEL_COLUMNS = tuple(f.name for f in LABEL_FIELDS)
TRUTH_COLUMNS = ("transaction_id", "is_fraud", "pattern")


@dataclass(frozen=True, eq=False)
class Simulation:
    """One simulated window. ``transactions`` and ``labels`` hold contract columns only (what is
    published); ``truth`` is the ground truth per transaction and is never published."""

    config: SimulationConfig
    transactions: pd.DataFrame  # sorted by event_time
    labels: pd.DataFrame  # sorted by reported_at
    truth: pd.DataFrame  # same row order as transactions

    def transaction_records(self) -> Iterator[dict[str, Any]]:
        """Contract dicts, absent optional fields left out (JSON-serialisable)."""
        return _records(self.transactions)

    def label_records(self) -> Iterator[dict[str, Any]]:
        return _records(self.labels)

    def pattern_counts(self) -> dict[str, int]:
        """Transactions per ground-truth pattern, ``genuine`` included, every pattern named."""
        counts = self.truth["pattern"].value_counts()
        return {name: int(counts.get(name, 0)) for name in (GENUINE, *PATTERNS)}


def simulate(config: SimulationConfig) -> Simulation:
    population = _population(config.seed, config.num_cards, config.num_merchants, config.tx_per_card_per_day,
                             config.population)
    rng = np.random.default_rng([config.seed, config.window_start.toordinal()])
    window = Window.of(config.window_start, config.days)
    genuine = genuine_block(rng, population, window, config.population, config.drift)
    events = _add_fraud(rng, FraudContext(population, genuine, window, config.fraud_shapes, config.seed), config)
    events = events.take(np.argsort(events.time_ms, kind="stable"))
    labels = LabelBlock.concat([
        fraud_reports(rng, events, config.label_delay, config.unreported_fraud_share),
        cleared_reports(rng, events, config.label_delay, config.cleared_report_rate),
        false_reports(rng, events, config.label_delay, config.false_report_rate, config.false_report_cleared_share),
    ]).sorted_by_report()
    ids = id_strings(f"tx-{config.window_start:%Y%m%d}-{config_fingerprint(config)}-", np.arange(len(events)), 9)
    return Simulation(
        config=config,
        transactions=_transactions_frame(events, ids, population),
        labels=_labels_frame(labels, ids),
        truth=_frame({
            "transaction_id": ids,
            "is_fraud": events.pattern > 0,
            "pattern": pa.array((GENUINE, *PATTERNS)).take(events.pattern),
        }),
    )


def _add_fraud(rng: np.random.Generator, ctx: FraudContext, config: SimulationConfig) -> EventBlock:
    """The genuine block plus every pattern's incidents, scheduled by :func:`.schedule.incident_days`."""
    genuine, window = ctx.genuine, ctx.window
    per_day = np.bincount((genuine.time_ms - window.start_ms) // MS_PER_DAY, minlength=window.days)
    mean_events = {name: pattern.mean_events(config.fraud_shapes) for name, pattern in GENERATORS.items()}
    days = incident_days(rng, config, per_day, window.start_day_ordinal, mean_events)
    blocks = [genuine]
    next_incident = 0
    for code, name in enumerate(PATTERNS, start=1):
        if len(days[name]) == 0:
            continue
        block = GENERATORS[name].generate(rng, ctx, days[name])
        blocks.append(dataclasses.replace(block, pattern=np.full(len(block), code, np.int8),
                                          incident=block.incident + next_incident))
        next_incident += int(block.incident.max()) + 1 if len(block) else 0
    return EventBlock.concat(blocks)


@functools.lru_cache(maxsize=2)
def _population(seed: int, num_cards: int, num_merchants: int, daily_rate: float,
                config: PopulationConfig) -> Population:
    # Cached: consecutive windows of one seed (nightly runs, tests) rebuild the same population.
    return build_population(seed, num_cards, num_merchants, daily_rate, config)


def _transactions_frame(events: EventBlock, ids: pa.Array, population: Population) -> pd.DataFrame:
    merchants = population.merchants
    country = merchants.country[events.merchant]
    device = id_strings("dv-", np.maximum(events.device, 0), 9)
    columns = {
        "schema_version": np.full(len(events), SCHEMA_VERSION, np.int64),
        "transaction_id": ids,
        "event_time": format_times(events.time_ms),
        "card_id": population.cards.names.take(events.card),
        "merchant_id": merchants.names.take(events.merchant),
        "amount": events.amount.astype(np.float64),
        "currency": pa.array(CURRENCIES).take(COUNTRY_CURRENCY[country]),
        "mcc": pa.array(MCC_CODES).take(merchants.mcc[events.merchant]),
        "channel": pa.array(KNOWN_CHANNELS).take(events.channel),
        "country": pa.array(COUNTRIES).take(country),
        "device_id": pc.if_else(pa.array(events.device == NO_DEVICE), pa.scalar(None, pa.string()), device),
    }
    return _frame(columns)[list(TRANSACTION_COLUMNS)]


def _labels_frame(labels: LabelBlock, ids: pa.Array) -> pd.DataFrame:
    columns = {
        "schema_version": np.full(len(labels), SCHEMA_VERSION, np.int64),
        "transaction_id": ids.take(labels.row),
        "is_fraud": labels.is_fraud,
        "reported_at": format_times(labels.reported_ms),
        "source": pa.array(KNOWN_LABEL_SOURCES).take(labels.source),
    }
    return _frame(columns)[list(LABEL_COLUMNS)]


def format_times(epoch_ms: np.ndarray) -> pa.Array:
    """Epoch milliseconds as RFC 3339 UTC strings with milliseconds and ``Z`` (the contract's form)."""
    text = pc.cast(pa.array(epoch_ms, pa.timestamp("ms")), pa.string())  # "YYYY-MM-DD hh:mm:ss.fff"
    return pc.binary_join_element_wise(pc.utf8_slice_codeunits(text, 0, 10), "T",
                                       pc.utf8_slice_codeunits(text, 11, 23), "Z", "")


def _frame(columns: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(values, dtype="str") if isinstance(values, pa.Array | pa.ChunkedArray)
                         else pd.Series(values) for name, values in columns.items()})


def _records(frame: pd.DataFrame) -> Iterator[dict[str, Any]]:
    names = list(frame.columns)
    columns = [frame[name].tolist() for name in names]
    for values in zip(*columns, strict=True):
        yield {k: v for k, v in zip(names, values, strict=True) if v is not None and v == v}  # v == v: not NaN
