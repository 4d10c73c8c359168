"""Seed the online features from the raw store, and say where Kafka consumption resumes.

The raw store holds exactly the records its committed offsets cover, so replaying its recent
partitions and then consuming each topic partition from the committed offset loses nothing and
repeats nothing (repeats would be harmless anyway: the feature state ignores a transaction id it
holds, and only the earliest fraud report of a payment counts).

How far back: the card windows read ``LOOKBACK_DAYS``; a merchant's fraud rate counts reports made
(plus the label delay) within its longest window, for payments up to ``label_match_days`` before
the report; a payment up to the expiry margin late needs that much more. Transactions from
``latest - (lookback + delay + match + margin)`` days on are therefore replayed, and the labels
reported since. Reads through the raw store's Arrow reader
(:mod:`pipeline.ingest.raw_reader`): no Spark session. Last, the features of the latest payments go
into the store's recent traffic (:mod:`.recent_traffic`), where a version's review threshold starts from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract import Kind
from pipeline.features import definitions as fd
from pipeline.features.online import Payment
from pipeline.features.params import FeatureParams
from pipeline.ingest.raw_layout import RawStore
from pipeline.ingest.raw_reader import read_raw
from pipeline.serving.features import FeatureStore

PAYMENT_COLUMNS = ("transaction_id", "card_id", "merchant_id", "event_time", "amount", "mcc", "channel", "country")
LABEL_COLUMNS = ("transaction_id", "is_fraud", "reported_at")


@dataclass(frozen=True)
class SeedReport:
    payments: int
    labels: int
    since: date | None  # first partition date replayed (None: the store was empty)
    offsets: dict[str, dict[int, int]]  # topic -> partition -> next offset to consume
    recent: int = 0  # of those payments, the latest whose features went into the recent traffic


def seed_history_days(params: FeatureParams) -> int:
    """How many days before the latest partition the features can still read."""
    return fd.LOOKBACK_DAYS + math.ceil(params.label_delay_hours / 24) + params.label_match_days


def _epoch_us(column: pa.ChunkedArray) -> list[int]:
    return pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64()).to_pylist()


def seed_from_raw_store(features: FeatureStore, raw_root: Path) -> SeedReport:
    """Replay the raw store's recent committed payments and labels into ``features``."""
    store = RawStore(raw_root)
    commit = store.committed()
    latest = store.latest_date(Kind.TRANSACTION)
    if latest is None:
        return SeedReport(0, 0, None, commit.offsets)
    since = latest - timedelta(days=seed_history_days(features.params) + math.ceil(features.expiry_margin_hours / 24))
    tx = read_raw(store, Kind.TRANSACTION, PAYMENT_COLUMNS, since)
    values = {c: tx[c].to_pylist() for c in PAYMENT_COLUMNS if c != "event_time"}
    ts = _epoch_us(tx["event_time"])

    def payment(i: int) -> Payment:
        return Payment(values["transaction_id"][i], values["card_id"][i], values["merchant_id"][i], ts[i],
                       values["amount"][i], values["mcc"][i], values["channel"][i], values["country"][i])

    for i in range(tx.num_rows):
        features.observe_payment(payment(i))
    labels = read_raw(store, Kind.LABEL, LABEL_COLUMNS, since)
    for tid, is_fraud, reported in zip(labels["transaction_id"].to_pylist(), labels["is_fraud"].to_pylist(),
                                       _epoch_us(labels["reported_at"]), strict=True):
        features.observe_label(tid, bool(is_fraud), reported)
    # After the labels: the latest payments' features count every report made before them.
    since_us = features.recent_since_us()
    recent = features.remember_recent([payment(i) for i in range(tx.num_rows) if since_us is not None
                                       and ts[i] >= since_us])
    return SeedReport(tx.num_rows, labels.num_rows, since, commit.offsets, recent)
