"""``fraudctl consistency --date D``: do the served features equal the features training would build?

Online side: the scores topic, where the service wrote the exact feature values each decision was
made on (first decision per transaction of event date ``D``). Offline side: the same transactions'
features rebuilt from the raw store by :func:`pipeline.features.frame.build_feature_frame` (the
kernel the Spark job uses), over all the history those rows can read. A transaction matches when
every feature agrees within ``tolerance`` (relative and absolute). The share is
``matched / scored``: a scored payment missing from the raw store counts against it.
``merchant_mismatch_share`` is the share of compared rows whose merchant features (counts and fraud
rates, :data:`MERCHANT_FEATURES`) differ: in a partitioned tier each partition learns other
partitions' payments of a shared merchant from the transactions topic, so this is what a topic
lagging behind the requests costs there (card features have one writer and cannot lag that way).

With the registry, the served score and decision are checked too: each deciding version, loaded as
training and the gate load it, scores the rebuilt features; a score that differs means the service's
model path (traced graph, blend term, calibration) is not the one the gate judged, and a decision
that differs at the thresholds the event records means the fusion policy is not what it claims.

Differences mean the online state missed something the raw store holds when the payment was
scored: history not seeded, a topic lagging behind the requests, payments arriving later than the
expiry margin, or a label delay that differs between ``ingest.toml`` and the running service.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.contract import Kind
from pipeline.features import definitions as fd
from pipeline.features.frame import build_feature_frame
from pipeline.features.params import FeatureParams
from pipeline.ingest.raw_layout import RawStore
from pipeline.ingest.raw_reader import read_raw
from pipeline.kafka.reader import read_topic
from pipeline.kafka.settings import KafkaConfig
from pipeline.registry.config import RegistryConfig
from pipeline.serving.decision import decide
from pipeline.serving.features import EPOCH, US, micros
from pipeline.serving.score_event import ScoreEvent
from pipeline.serving.seed import LABEL_COLUMNS, PAYMENT_COLUMNS, seed_history_days
from pipeline.serving.thresholds import Thresholds

TOLERANCE = 1e-9
# The service scores with a traced float32 graph, the registry's pyfunc with the eager module: the same
# operations, which agreed within 1.2e-7 on the demo's live day.
SCORE_TOLERANCE = 1e-6
MERCHANT_FEATURES = frozenset((*(fd.merchant_count(d) for d in fd.MERCHANT_WINDOWS_DAYS),
                               *(fd.merchant_fraud_rate(d) for d in fd.MERCHANT_WINDOWS_DAYS)))
MAX_EXAMPLES = 10


@dataclass(frozen=True)
class ConsistencyReport:
    date: str
    scored: int  # transactions of the date with a decision on the scores topic
    compared: int  # of those, found in the raw store
    matched: int  # every feature within tolerance
    tolerance: float
    merchant_mismatched: int = 0  # compared rows whose merchant features differ
    mismatched_features: dict[str, int] = field(default_factory=dict)  # feature -> transactions differing
    examples: list[dict[str, Any]] = field(default_factory=list)  # first differences seen
    scores: ScoreAgreement | None = None  # served vs offline score and decision (None: not checked)

    @property
    def missing_offline(self) -> int:
        return self.scored - self.compared

    @property
    def share(self) -> float:
        return self.matched / self.scored if self.scored else float("nan")

    @property
    def merchant_mismatch_share(self) -> float:
        return self.merchant_mismatched / self.compared if self.compared else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"date": self.date, "scored": self.scored, "compared": self.compared,
                "missing_offline": self.missing_offline, "matched": self.matched, "share": self.share,
                "merchant_mismatched": self.merchant_mismatched,
                "merchant_mismatch_share": self.merchant_mismatch_share, "tolerance": self.tolerance, "mismatched_features": self.mismatched_features,
                "examples": self.examples, "scores": None if self.scores is None else self.scores.to_dict()}


def event_date(event_time: str) -> date:
    return (EPOCH + micros(event_time) * US).date()


def online_features(events: list[ScoreEvent], day: date) -> dict[str, dict[str, float | int]]:
    """The features of the first decision on each transaction of ``day``."""
    out: dict[str, dict[str, float | int]] = {}
    for event in events:
        if event.transaction_id not in out and event_date(event.event_time) == day:
            out[event.transaction_id] = event.features
    return out


def compare(online: dict[str, dict[str, float | int]], offline: dict[str, dict[str, Any]], day: date,
            tolerance: float = TOLERANCE) -> ConsistencyReport:
    """Pure: how many online feature rows equal their offline row (matched by transaction id)."""
    mismatched: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    compared = matched = merchant_mismatched = 0
    for tid, served in online.items():
        rebuilt = offline.get(tid)
        if rebuilt is None:
            continue
        compared += 1
        differing = [name for name in fd.FEATURE_COLUMNS if not math.isclose(
            float(served[name]), float(rebuilt[name]), rel_tol=tolerance, abs_tol=tolerance)]
        mismatched.update(differing)
        matched += not differing
        merchant_mismatched += any(name in MERCHANT_FEATURES for name in differing)
        for name in differing:
            if len(examples) < MAX_EXAMPLES:
                examples.append({"transaction_id": tid, "feature": name, "online": served[name],
                                 "offline": float(rebuilt[name])})
    return ConsistencyReport(day.isoformat(), len(online), compared, matched, tolerance, merchant_mismatched,
                             dict(mismatched), examples)


def offline_features(raw_root: Path, params: FeatureParams, day: date) -> dict[str, dict[str, Any]]:
    """Feature rows of the raw store's transactions of ``day``, by transaction id."""
    store = RawStore(raw_root)
    since = day - timedelta(days=seed_history_days(params))
    tx = read_raw(store, Kind.TRANSACTION, PAYMENT_COLUMNS, since, day).to_pandas()
    if tx.empty:
        return {}
    labels = read_raw(store, Kind.LABEL, LABEL_COLUMNS, since, day).to_pandas()
    # Nanosecond timestamps: the frame builder's time axis takes pandas' default unit.
    tx["event_time"] = pd.to_datetime(tx["event_time"], utc=True).astype("datetime64[ns, UTC]")
    labels["reported_at"] = pd.to_datetime(labels["reported_at"], utc=True).astype("datetime64[ns, UTC]")
    frame = build_feature_frame(tx, labels, params)
    frame = frame[frame["event_time"].dt.date == day]
    return frame.set_index("transaction_id")[list(fd.FEATURE_COLUMNS)].to_dict("index")


@dataclass(frozen=True)
class ScoreAgreement:
    """The served score and decision against the offline model's on the rebuilt features.

    ``compared``: decisions whose payment the raw store holds; ``matched``: the deciding version,
    loaded from the registry and fed the rebuilt features, scores within ``SCORE_TOLERANCE`` of the
    served score. ``decisions_compared``: those decided by the score (not a rule) at recorded
    thresholds; ``decisions_matched``: the offline score, at those same thresholds, decides alike.
    """

    compared: int = 0
    matched: int = 0
    max_difference: float = 0.0
    decisions_compared: int = 0
    decisions_matched: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"compared": self.compared, "matched": self.matched, "max_difference": self.max_difference,
                "tolerance": SCORE_TOLERANCE, "decisions_compared": self.decisions_compared,
                "decisions_matched": self.decisions_matched, "examples": self.examples}


def first_decisions(events: list[ScoreEvent], day: date) -> dict[str, ScoreEvent]:
    """The first decision on each transaction of ``day`` (the one :func:`online_features` reads)."""
    out: dict[str, ScoreEvent] = {}
    for event in events:
        if event.transaction_id not in out and event_date(event.event_time) == day:
            out[event.transaction_id] = event
    return out


def compare_scores(decisions: dict[str, ScoreEvent], offline: dict[str, dict[str, Any]],
                   score: Callable[[int, pd.DataFrame], np.ndarray]) -> ScoreAgreement:
    """Pure but for ``score(version, feature rows)``, the offline model of each deciding version."""
    by_version: dict[int, list[str]] = {}
    for tid, event in decisions.items():
        if tid in offline:
            by_version.setdefault(event.model_version, []).append(tid)
    compared = matched = decided = agreed = 0
    worst = 0.0
    examples: list[dict[str, Any]] = []
    for version, ids in sorted(by_version.items()):
        frame = pd.DataFrame([offline[tid] for tid in ids], columns=list(fd.FEATURE_COLUMNS))
        for tid, rebuilt in zip(ids, score(version, frame), strict=True):
            event = decisions[tid]
            gap = abs(float(rebuilt) - event.score)
            worst = max(worst, gap)
            compared += 1
            matched += gap <= SCORE_TOLERANCE
            offline_decision = None
            if event.decided_by == "score" and event.review_threshold is not None:
                offline_decision = decide(float(rebuilt), (), Thresholds(event.review_threshold, event.block_threshold,
                                                                         "version"), 1.0).decision.value
                decided += 1
                agreed += offline_decision == event.decision
            if (gap > SCORE_TOLERANCE or offline_decision not in (None, event.decision)) and len(examples) < MAX_EXAMPLES:
                examples.append({"transaction_id": tid, "model_version": version, "served_score": event.score,
                                 "offline_score": float(rebuilt), "served_decision": event.decision,
                                 "offline_decision": offline_decision})
    return ScoreAgreement(compared, matched, worst, decided, agreed, examples)


def registry_scorer(registry: RegistryConfig) -> Callable[[int, pd.DataFrame], np.ndarray]:
    """``score(version, rows)`` with the registered version as training and the gate load it (pyfunc)."""
    from pipeline.registry.scoring import load_scorer, score_rows
    from pipeline.registry.store import connect, version_uri

    connect(registry)  # points MLflow at the registry's store
    loaded: dict[int, Any] = {}

    def score(version: int, frame: pd.DataFrame) -> np.ndarray:
        uri = version_uri(registry.model_name, version)
        if version not in loaded:
            loaded[version] = load_scorer(uri)
        return score_rows(loaded[version], uri, frame)

    return score


def check_consistency(day: date, kafka: KafkaConfig, scores_topic: str, raw_root: Path, params: FeatureParams,
                      tolerance: float = TOLERANCE, registry: RegistryConfig | None = None) -> ConsistencyReport:
    """Read the scores topic and the raw store, rebuild and compare (see the module doc); with
    ``registry``, also score the rebuilt features with each deciding version and compare the scores
    and decisions (:func:`compare_scores`)."""
    events = [ScoreEvent.from_json(r.value) for r in read_topic(kafka, scores_topic) if r.value]
    online = online_features(events, day)
    offline = offline_features(raw_root, params, day) if online else {}
    report = compare(online, offline, day, tolerance)
    if registry is None or not online:
        return report
    return replace(report, scores=compare_scores(first_decisions(events, day), offline, registry_scorer(registry)))
