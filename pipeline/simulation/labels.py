"""When and how the bank learns the truth about a payment.

Fraud is reported per incident (the cardholder disputes the whole attack at once), a lognormal
number of days after the incident's last payment, or never (``unreported_fraud_share``: these
stay labelled genuine by omission, as in real feeds). A small share of genuine payments gets an
explicit ``is_fraud=false`` from a manual review. Another small share is wrongly disputed as fraud
(``false_report_rate``: the cardholder forgot the purchase, or friendly fraud); a review clears
``false_report_cleared_share`` of those later with an ``is_fraud=false`` report, the rest stay
wrong. The latest report of a payment is its label. Reports may fall after the window: they are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from pipeline.contract import KNOWN_LABEL_SOURCES
from pipeline.simulation.blocks import MS_PER_DAY, MS_PER_MINUTE, NO_INCIDENT, EventBlock
from pipeline.simulation.config import LabelDelayConfig

SOURCE_SHARES = {"chargeback": 0.6, "customer_report": 0.3, "manual_review": 0.1}  # of fraud reports
_SOURCE_P = np.array([SOURCE_SHARES[s] for s in KNOWN_LABEL_SOURCES])
MANUAL_REVIEW = KNOWN_LABEL_SOURCES.index("manual_review")
# A wrongful dispute comes from the cardholder (chargeback or report), never from the bank's review.
_DISPUTE_P = np.where(np.arange(len(KNOWN_LABEL_SOURCES)) == MANUAL_REVIEW, 0.0, _SOURCE_P)
_DISPUTE_P = _DISPUTE_P / _DISPUTE_P.sum()


@dataclass(frozen=True)
class LabelBlock:
    """Parallel arrays, one element per label event."""

    row: np.ndarray  # index of the labelled transaction in the event block
    is_fraud: np.ndarray  # bool
    reported_ms: np.ndarray  # epoch ms, >= the transaction's time
    source: np.ndarray  # index into contract.KNOWN_LABEL_SOURCES

    def __len__(self) -> int:
        return len(self.row)

    @classmethod
    def concat(cls, blocks: list[LabelBlock]) -> LabelBlock:
        return cls(**{f.name: np.concatenate([getattr(b, f.name) for b in blocks]) for f in fields(cls)})

    def sorted_by_report(self) -> LabelBlock:
        order = np.argsort(self.reported_ms, kind="stable")
        return LabelBlock(**{f.name: getattr(self, f.name)[order] for f in fields(self)})


def fraud_reports(rng: np.random.Generator, events: EventBlock, delay: LabelDelayConfig,
                  unreported_share: float) -> LabelBlock:
    rows = np.flatnonzero(events.incident != NO_INCIDENT)
    incident = events.incident[rows]
    n_incidents = int(incident.max()) + 1 if len(rows) else 0
    incident_end = np.full(n_incidents, np.iinfo(np.int64).min)
    np.maximum.at(incident_end, incident, events.time_ms[rows])
    reported = rng.random(n_incidents) >= unreported_share
    delay_ms = _lognormal_ms(rng, delay.fraud_median_days, delay.fraud_sigma, n_incidents)
    source = rng.choice(len(KNOWN_LABEL_SOURCES), size=n_incidents, p=_SOURCE_P)
    keep = reported[incident]
    rows, incident = rows[keep], incident[keep]
    # Disputed payments of one incident are keyed in one by one, minutes apart.
    jitter = rng.integers(0, 30 * MS_PER_MINUTE, len(rows))
    return LabelBlock(row=rows, is_fraud=np.ones(len(rows), bool),
                      reported_ms=incident_end[incident] + delay_ms[incident] + jitter, source=source[incident])


def cleared_reports(rng: np.random.Generator, events: EventBlock, delay: LabelDelayConfig,
                    rate: float) -> LabelBlock:
    rows = np.flatnonzero((events.incident == NO_INCIDENT) & (rng.random(len(events)) < rate))
    reported = events.time_ms[rows] + _lognormal_ms(rng, delay.cleared_median_days, delay.cleared_sigma, len(rows))
    return LabelBlock(row=rows, is_fraud=np.zeros(len(rows), bool), reported_ms=reported,
                      source=np.full(len(rows), MANUAL_REVIEW))


def false_reports(rng: np.random.Generator, events: EventBlock, delay: LabelDelayConfig, rate: float,
                  cleared_share: float) -> LabelBlock:
    """Genuine payments disputed as fraud, then for ``cleared_share`` of them cleared by a review."""
    rows = np.flatnonzero((events.incident == NO_INCIDENT) & (rng.random(len(events)) < rate))
    reported = events.time_ms[rows] + _lognormal_ms(rng, delay.fraud_median_days, delay.fraud_sigma, len(rows))
    disputes = LabelBlock(row=rows, is_fraud=np.ones(len(rows), bool), reported_ms=reported,
                          source=rng.choice(len(KNOWN_LABEL_SOURCES), size=len(rows), p=_DISPUTE_P))
    cleared = rng.random(len(rows)) < cleared_share
    review_ms = reported[cleared] + _lognormal_ms(rng, delay.cleared_median_days, delay.cleared_sigma,
                                                  int(cleared.sum()))
    clearances = LabelBlock(row=rows[cleared], is_fraud=np.zeros(int(cleared.sum()), bool),
                            reported_ms=np.maximum(review_ms, reported[cleared] + 1),
                            source=np.full(int(cleared.sum()), MANUAL_REVIEW))
    return LabelBlock.concat([disputes, clearances])


def _lognormal_ms(rng: np.random.Generator, median_days: float, sigma: float, n: int) -> np.ndarray:
    return (rng.lognormal(np.log(median_days), sigma, n) * MS_PER_DAY).astype(np.int64)
