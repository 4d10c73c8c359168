"""The kernel over in-memory pandas frames: feature rows without Spark.

The same kernel and label rule as the Spark job (:mod:`pipeline.features.spark_kernel`), for data
that fits in one process: model experiments and tests on simulated windows, the consistency check
of the scoring service. Tested equal to the Spark rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.features import definitions as fd
from pipeline.features.kernel import (
    US_PER_DAY,
    CardEvents,
    KeyedTimes,
    card_features,
    categorical_codes,
    merchant_features,
    time_features,
)
from pipeline.features.params import FeatureParams


def epoch_micros(column: pd.Series) -> np.ndarray:
    """Epoch microseconds of RFC 3339 strings or timestamps of any unit."""
    return pd.to_datetime(column, utc=True, format="ISO8601").dt.as_unit("us").astype("int64").to_numpy()


def _dense(values: pd.Series) -> np.ndarray:
    return pd.factorize(values, use_na_sentinel=False)[0].astype(np.int64)


def fraud_known_instants(tx: pd.DataFrame, ts_us: np.ndarray, labels: pd.DataFrame,
                         params: FeatureParams) -> pd.DataFrame:
    """``merchant_id, ts_us``: first fraud report + label delay, for reports whose payment is in ``tx``
    and happened at most ``label_match_days`` before the report (twin of ``fraud_known_events``)."""
    frauds = labels[labels["is_fraud"].astype(bool)]
    first = (pd.DataFrame({"transaction_id": frauds["transaction_id"].to_numpy(),
                           "reported_us": epoch_micros(frauds["reported_at"])})
             .groupby("transaction_id", sort=False)["reported_us"].min())
    payments = pd.DataFrame({"transaction_id": tx["transaction_id"].to_numpy(),
                             "merchant_id": tx["merchant_id"].to_numpy(), "tx_us": ts_us})
    joined = payments.merge(first.rename("reported_us"), left_on="transaction_id", right_index=True)
    joined = joined[joined["tx_us"] >= joined["reported_us"] - params.label_match_days * US_PER_DAY]
    return pd.DataFrame({"merchant_id": joined["merchant_id"].to_numpy(),
                         "ts_us": joined["reported_us"].to_numpy() + params.label_delay_us})


def build_feature_frame(transactions: pd.DataFrame, labels: pd.DataFrame, params: FeatureParams) -> pd.DataFrame:
    """Feature rows of every transaction (contract columns; ``event_time`` as RFC 3339 strings or
    timestamps), in the input's row order: ``transaction_id, card_id, event_time`` and ``FEATURE_COLUMNS``."""
    ts = epoch_micros(transactions["event_time"])
    amount = transactions["amount"].to_numpy(dtype=np.float64)
    known = fraud_known_instants(transactions, ts, labels, params)
    out = pd.DataFrame({"transaction_id": transactions["transaction_id"].to_numpy(),
                        "card_id": transactions["card_id"].to_numpy(),
                        "event_time": pd.to_datetime(ts, unit="us", utc=True)})
    columns: dict[str, np.ndarray] = {"amount": amount} | time_features(ts)

    card = _dense(transactions["card_id"])
    order = np.lexsort((ts, card))
    events = CardEvents(key=card[order], ts_us=ts[order], amount=amount[order],
                        merchant=_dense(transactions["merchant_id"])[order],
                        country=_dense(transactions["country"])[order])
    for name, values in card_features(events, events).items():
        columns[name] = _unsort(values, order)

    merchants, merchant_key = np.unique(np.concatenate([transactions["merchant_id"].to_numpy(dtype=str),
                                                        known["merchant_id"].to_numpy(dtype=str)]),
                                        return_inverse=True)
    tx_key, fraud_key = merchant_key[:len(ts)], merchant_key[len(ts):]
    tx_order = np.lexsort((ts, tx_key))
    fraud_ts = known["ts_us"].to_numpy(dtype=np.int64)
    fraud_order = np.lexsort((fraud_ts, fraud_key))
    payments = KeyedTimes(tx_key[tx_order], ts[tx_order])
    rates = merchant_features(payments, KeyedTimes(fraud_key[fraud_order], fraud_ts[fraud_order]), payments)
    for name, values in rates.items():
        columns[name] = _unsort(values, tx_order)

    codes = categorical_codes({raw: transactions[raw].to_numpy(dtype=object) for raw in fd.CATEGORICAL_SOURCES.values()})
    for name in fd.NUMERIC_FEATURES:
        out[name] = columns[name]
    for name in fd.CATEGORICAL_FEATURES:
        out[name] = codes[name]
    return out


def _unsort(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    restored = np.empty_like(values)
    restored[order] = values
    return restored
