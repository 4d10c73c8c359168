"""Faults the monitor was not written for, injected into a bench portfolio's live week.

The decisions bench (:mod:`pipeline.bench.decisions`) serves each of these to the champion and asks
the monitor's rules how many days it takes to notice. Each comes from the portfolio's own dynamics,
not from the shape of a rule:

* ``new_fraud_pattern``: a fraud pattern the preset never simulated (so absent from training) starts
  on the onset day, as much fraud again as the portfolio already has. Made by the simulator itself
  (same seed, so the same cards and merchants; only that pattern switched on), not by editing rows.
  A preset that simulates every pattern gets one withheld (:func:`withheld_pattern`): the bench
  builds that preset without it and trains a model on that portfolio for this fault;
* ``channel_outage``: from the onset day, one feature is served stuck at its training median for the
  payments of one channel only, the channel closest to :data:`OUTAGE_SHARE` of the traffic (a feature
  source that is down behind one integration path);
* ``acquirer_minor_units``: from the onset day, one acquirer's merchants send amounts in minor units
  (x100). The simulator has no acquirers: each merchant belongs to one of :data:`NUM_ACQUIRERS` by a
  stable hash of its id, so an acquirer's portfolio cuts across countries, channels and merchant kinds.

Faults in the raw payments (the first and the last) go through the feature kernel again
(:func:`pipeline.features.frame.build_feature_frame`, the kernel the service and Spark share), so a
card's history carries the wrong amounts and the new fraud as its online features would. A fault in
serving (the outage) is applied to the served feature rows.

Everything here is pure: frames in, frames out.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any

import numpy as np
import pandas as pd

from pipeline.contract import KNOWN_CHANNELS
from pipeline.features import definitions as fd
from pipeline.features.frame import build_feature_frame
from pipeline.features.params import FeatureParams
from pipeline.simulation.config import PATTERNS, PatternMix, SimulationConfig
from pipeline.simulation.simulator import simulate

ONSET_DAY = 3  # faults start on the live week's 3rd day: the two healthy days before show a rule that fires anyway
OUTAGE_SHARE = 0.3  # the outage hits the channel whose share of payments is closest to this
NUM_ACQUIRERS = 8  # merchants spread over this many acquirers; the faulty one carries ~1/8 of payments
FAULTY_ACQUIRER = 0
MINOR_UNITS = 100.0  # cents for euros, pence for pounds


@dataclass(frozen=True)
class LiveWeek:
    """A bench portfolio's live (test) week as served healthy, and the simulated window behind it."""

    served: pd.DataFrame  # the holdout's feature rows with ``label``
    transactions: pd.DataFrame  # every payment of the window (contract columns): the week and its history
    reports: pd.DataFrame  # the fraud reports the raw store holds (made by the window's end)
    truth: pd.DataFrame  # transaction_id, pattern (the simulator's)
    config: SimulationConfig  # what simulated the window (its dates and size)
    labels_cutoff: datetime  # reports made before this label the week, as in the holdout
    params: FeatureParams

    @property
    def days(self) -> list[date]:
        return sorted(set(event_days(self.served["event_time"])))


@dataclass(frozen=True)
class Degradation:
    """The live week as served under one fault."""

    name: str
    description: str
    frame: pd.DataFrame  # the live week's served feature rows, with ``label`` (and ``pattern`` where known)
    affected: np.ndarray  # bool per row of ``frame``: the rows the fault touches
    first_affected_day: date
    detail: dict[str, Any]


def onset(days: list[date]) -> date:
    """The first faulty day of a live week of ``days`` (sorted)."""
    return days[min(ONSET_DAY, len(days)) - 1]


def utc_start(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


def event_days(event_time: pd.Series) -> np.ndarray:
    """UTC dates of ``event_time`` (RFC 3339 strings or timestamps)."""
    return pd.to_datetime(event_time, utc=True, format="ISO8601").dt.date.to_numpy()


def acquirer_of(merchant_ids: np.ndarray) -> np.ndarray:
    """The acquirer (0 .. NUM_ACQUIRERS - 1) of each merchant: a stable hash of its id."""
    return np.array([zlib.crc32(str(m).encode()) % NUM_ACQUIRERS for m in merchant_ids], dtype=np.int64)


def in_minor_units(transactions: pd.DataFrame, acquirer: int, since: date) -> tuple[pd.DataFrame, np.ndarray]:
    """``transactions`` with the amounts of ``acquirer``'s merchants from ``since`` on multiplied by
    MINOR_UNITS, and the mask of the rows changed."""
    changed = ((acquirer_of(transactions["merchant_id"].to_numpy()) == acquirer)
               & (event_days(transactions["event_time"]) >= since))
    out = transactions.copy()
    out.loc[changed, "amount"] = out.loc[changed, "amount"].to_numpy(np.float64) * MINOR_UNITS
    return out, changed


def channel_shares(channels: np.ndarray) -> dict[str, float]:
    """Share of payments per known channel, of the payments' raw ``channels``."""
    return {c: float(np.mean(channels == c)) for c in KNOWN_CHANNELS}


def outage_channel(channels: np.ndarray) -> str:
    """The channel whose share of the payments (their raw ``channels``) is closest to OUTAGE_SHARE."""
    shares = channel_shares(channels)
    return min(shares, key=lambda c: abs(shares[c] - OUTAGE_SHARE))


def stuck_in_channel(frame: pd.DataFrame, channels: np.ndarray, channel: str, feature: str, value: float,
                     since: date) -> tuple[pd.DataFrame, np.ndarray]:
    """``frame`` (served feature rows; ``channels``: each row's raw channel) with ``feature`` at
    ``value`` for ``channel``'s payments from ``since`` on, and the mask of those rows."""
    hit = (channels == channel) & (event_days(frame["event_time"]) >= since)
    out = frame.copy()
    out.loc[hit, feature] = value
    return out, hit


def absent_pattern(config: SimulationConfig) -> str | None:
    """A fraud pattern the preset never simulates (weight 0), the latest added; None if it has all."""
    weights = config.pattern_mix.weights()
    return next((p for p in reversed(PATTERNS) if weights[p] <= 0), None)


def withheld_pattern(config: SimulationConfig) -> str:
    """For a preset that simulates every pattern, the one to withhold from a portfolio so that it can
    appear new: the smallest share (withholding it changes the training portfolio least; the latest
    added on a tie)."""
    weights = config.pattern_mix.weights()
    return min(reversed(PATTERNS), key=lambda p: weights[p])


def only_pattern(config: SimulationConfig, pattern: str) -> SimulationConfig:
    """``config`` with ``pattern`` the only fraud, at the same fraud rate: the same seed keeps the
    cards, merchants and calendar, and the changed mix changes every transaction id."""
    mix = PatternMix(**{p: (1.0 if p == pattern else 0.0) for p in PATTERNS})
    return dataclasses.replace(config, pattern_mix=mix)


def new_fraud(transactions: pd.DataFrame, labels: pd.DataFrame, truth: pd.DataFrame, pattern: str,
              since: date, until: date) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The payments of ``pattern`` (by ``truth``) made ``since`` .. ``until``, and their reports."""
    days = event_days(transactions["event_time"])
    keep = (truth["pattern"].to_numpy() == pattern) & (days >= since) & (days <= until)
    ids = set(transactions.loc[keep, "transaction_id"])
    return transactions[keep], labels[labels["transaction_id"].isin(ids)]


def served_rows(transactions: pd.DataFrame, labels: pd.DataFrame, params: FeatureParams,
                ids: pd.Index) -> pd.DataFrame:
    """Feature rows of the payments ``ids``, computed over all of ``transactions`` (their history)
    with the fraud reports ``labels``, in event-time order."""
    frame = build_feature_frame(transactions, labels, params)
    return frame[frame["transaction_id"].isin(ids)].sort_values("event_time", kind="stable").reset_index(drop=True)


def matured_fraud(labels: pd.DataFrame, cutoff: datetime) -> set[str]:
    """Transactions reported as fraud before ``cutoff``."""
    reported = pd.to_datetime(labels["reported_at"], utc=True, format="ISO8601")
    frauds = labels[labels["is_fraud"].astype(bool).to_numpy() & (reported < cutoff).to_numpy()]
    return set(frauds["transaction_id"])


def recomputed(week: LiveWeek, transactions: pd.DataFrame, reports: pd.DataFrame) -> pd.DataFrame:
    """The live week's rows, and any payment in ``transactions`` the window did not have, through the
    feature kernel over ``transactions`` and ``reports``; labelled as the holdout labels them (a new
    payment: reported as fraud before the labels' cutoff)."""
    known = pd.Index(week.served["transaction_id"])
    new = pd.Index(transactions["transaction_id"]).difference(pd.Index(week.transactions["transaction_id"]))
    frame = served_rows(transactions, reports, week.params, known.union(new))
    label = week.served.set_index("transaction_id")["label"].astype(int)
    fraud = matured_fraud(reports, week.labels_cutoff)
    ids = frame["transaction_id"]
    frame["label"] = np.where(ids.isin(known), ids.map(label).fillna(0), ids.isin(fraud)).astype(int)
    frame["pattern"] = ids.map(week.truth.set_index("transaction_id")["pattern"]).fillna("unknown").to_numpy()
    return frame


def new_fraud_pattern(week: LiveWeek) -> Degradation | None:
    """A pattern the preset never simulates, from the onset day to the week's end, by ``simulate``
    the simulator with only that pattern switched on (same seed: same cards and merchants); None when
    the preset already simulates every pattern."""
    pattern = absent_pattern(week.config)
    if pattern is None:
        return None
    start, end = onset(week.days), week.days[-1]
    config = dataclasses.replace(only_pattern(week.config, pattern), start_date=start.isoformat(),
                                 days=(end - start).days + 1)
    sim = simulate(config)
    extra, extra_reports = new_fraud(sim.transactions, sim.labels, sim.truth, pattern, start, end)
    transactions = pd.concat([week.transactions, extra], ignore_index=True)
    frame = recomputed(week, transactions, pd.concat([week.reports, extra_reports], ignore_index=True))
    frame.loc[frame["transaction_id"].isin(set(extra["transaction_id"])), "pattern"] = pattern
    affected = frame["pattern"].to_numpy() == pattern
    return Degradation(
        "new_fraud_pattern", f"fraud pattern {pattern}, absent from the portfolio (so from training), from {start}: "
        "as much fraud again as the portfolio has", frame, affected, start,
        {"pattern": pattern, "payments": int(affected.sum()), "frauds_labelled": int(frame.loc[affected, "label"].sum()),
         "frauds_labelled_other": int(frame.loc[~affected, "label"].sum())})


def channel_outage(week: LiveWeek, feature: str, value: float) -> Degradation:
    """``feature`` served stuck at ``value`` for one channel's payments (:func:`outage_channel`) from
    the onset day. The channel is a raw one: its code may be shared with another channel (the
    codes are hashes), which the monitor, seeing codes only, has to live with."""
    channels = week.served["transaction_id"].map(
        week.transactions.set_index("transaction_id")["channel"]).to_numpy(dtype=object)
    channel = outage_channel(channels)
    start = onset(week.days)
    frame, hit = stuck_in_channel(week.served, channels, channel, feature, value, start)
    code = fd.categorical_code(channel, fd.CATEGORICAL_FEATURES["channel_code"])
    sharing = [c for c in KNOWN_CHANNELS if c != channel
               and fd.categorical_code(c, fd.CATEGORICAL_FEATURES["channel_code"]) == code]
    share = channel_shares(channels)[channel]
    return Degradation(
        "channel_outage", f"feature {feature} stuck at {value:.6g} for channel {channel}'s payments "
        f"({share:.0%} of the traffic) from {start}", frame, hit, start,
        {"channel": channel, "channel_share": share, "channel_code": code, "code_shared_with": sharing,
         "feature": feature, "value": value,
         "share_of_affected_days": float(hit[event_days(frame["event_time"]) >= start].mean())})


def acquirer_minor_units(week: LiveWeek) -> Degradation:
    """:data:`FAULTY_ACQUIRER`'s merchants send amounts x MINOR_UNITS from the onset day."""
    start = onset(week.days)
    transactions, changed = in_minor_units(week.transactions, FAULTY_ACQUIRER, start)
    frame = recomputed(week, transactions, week.reports)
    affected = frame["transaction_id"].isin(set(transactions.loc[changed, "transaction_id"])).to_numpy()
    return Degradation(
        "acquirer_minor_units", f"acquirer {FAULTY_ACQUIRER} of {NUM_ACQUIRERS} sends amounts in minor units "
        f"(x{MINOR_UNITS:g}) from {start}", frame, affected, start,
        {"acquirer": FAULTY_ACQUIRER, "acquirers": NUM_ACQUIRERS,
         "share_of_affected_days": float(affected[event_days(frame["event_time"]) >= start].mean())})
