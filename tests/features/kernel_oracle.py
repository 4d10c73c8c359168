"""The offline oracle the online-feature tests compare against: the training frame builder's row."""

from __future__ import annotations

import pandas as pd

from pipeline.features.frame import build_feature_frame
from pipeline.features.online import Payment
from pipeline.features.params import FeatureParams


def kernel_row(payments: list[Payment], reports: list[tuple[str, bool, int]], params: FeatureParams,
               transaction_id: str) -> dict:
    """The offline (training) row of ``transaction_id`` over exactly these payments and reports
    (``(transaction_id, is_fraud, reported_at_us)``)."""
    tx = pd.DataFrame({"transaction_id": [p.transaction_id for p in payments],
                       "card_id": [p.card_id for p in payments], "merchant_id": [p.merchant_id for p in payments],
                       "event_time": pd.to_datetime([p.ts_us for p in payments], unit="us", utc=True),
                       "amount": [p.amount for p in payments], "mcc": [p.mcc for p in payments],
                       "channel": [p.channel for p in payments], "country": [p.country for p in payments]})
    labels = pd.DataFrame({"transaction_id": [r[0] for r in reports], "is_fraud": [r[1] for r in reports],
                           "reported_at": pd.to_datetime([r[2] for r in reports], unit="us", utc=True)})
    frame = build_feature_frame(tx, labels, params)
    return frame[frame["transaction_id"] == transaction_id].iloc[0].to_dict()
