"""The monitor's config slice, ``conf/<env>/monitoring.toml``: when a live model counts as degraded,
how much evidence that takes, and what the monitor may do about it.

Where the scores come from (Kafka, the scores topic of ``serving.toml``), which reports count (the
raw store and ``label_maturity_days`` of ``ingest.toml``) and which registry holds the versions
(``registry.toml``) are not repeated here: one definition each.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.config import ConfigError, load_section
from pipeline.features import definitions as fd


@dataclass(frozen=True)
class MonitoringConfig:
    # degraded: realised recall at the operating points below (expected recall - recall_margin) ...
    recall_margin: float = 0.1
    # ... with this confidence: the day's recall counts as below when its one-sided upper bound (exact
    # binomial, over the day's matured frauds) is below the floor, so a day of few frauds needs a clearer
    # drop; 0 compares the point estimate alone
    confidence: float = 0.0
    # ... on this many monitored days in a row (days with too few frauds are skipped, not counted)
    degraded_after_days: int = 3
    # a version with fewer matured frauds on the day is "insufficient evidence", never degraded
    min_frauds: int = 20
    # ... or the day's ranking of its frauds below (validation AUC - auc_margin): its AUC's one-sided
    # upper bound at `confidence` (DeLong, by card: one card's frauds are one piece of evidence). Frauds
    # the model ranks among the genuine (a pattern it never learned) pull the AUC down even where the
    # review budget caps recall so low that a day's recall stays within chance (0: off)
    auc_margin: float = 0.0
    # ... judged only on days with at least this many matured frauds: the bound is DeLong's normal
    # approximation, and at a handful of frauds one fraud scored like a genuine payment moves the AUC by
    # 0.1-0.2 (the quick default bench's healthy week: 6 frauds, AUC 0.72 against 0.92, a false alarm)
    auc_min_frauds: int = 20
    # ... or the day's missed fraud cards (a card with a matured fraud, none of its frauds that day flagged)
    # per payment above missed_fraud_factor x the validation split's rate, by the ratio's one-sided lower
    # bound at `confidence` (pipeline.monitoring.missed_frauds): a pattern the model never learned adds
    # cards that get through where the budget caps recall too low for a day's recall to tell (0: off)
    missed_fraud_factor: float = 0.0
    # realised review rate outside budget x (1 +- band) is reported as a finding (not a state)
    alert_rate_band: float = 0.5
    # opt-in: a degraded champion is rolled back to previous-champion (audited, with the reason)
    auto_rollback: bool = False
    # drift findings: PSI of the live scores vs validation, of a served feature vs the training split
    score_psi_warn: float = 0.25
    feature_psi_warn: float = 0.25
    # a served feature stuck at one value (its most common value this share of the day's payments or
    # more, where training's most common value is at most this share - 0.1) is a broken input: the
    # version is degraded that day whatever its recall, without waiting for labels (0: off). Not a
    # PSI bound: count features of a growing portfolio drift far (PSI ~6 in the bench) and are fine.
    stuck_feature_share: float = 0.0
    # a served feature broken within one segment: in the payments of one value of one of these code
    # features ("channel_code": one channel; "mcc_code": one merchant category), the share of its values
    # other than the most common one is at most segment_kept times that share in the same segment of
    # training, and so far below it that chance does that about once in 100 days over all the segments
    # and features judged (pipeline.monitoring.drift.segment_collapses): a source stuck, or answering a
    # default, behind one integration path, which the whole day dilutes below stuck_feature_share;
    # degraded like a stuck feature. () or 0: not looked for
    segment_features: tuple[str, ...] = ()
    segment_kept: float = 0.0
    # served values outside the training sample's 0.1% .. 99.9% quantiles on more than this share of the
    # day's payments, for a feature in range_features, are a broken input (amounts in minor units, a
    # scale or overflow bug): degraded, labels or not (0: off). Only the payment's own fields belong in
    # range_features: history counts of a growing portfolio leave their training range by design.
    range_features: tuple[str, ...] = ()
    out_of_range_share: float = 0.0
    feature_bins: int = 10  # quantile bins of the training split per numeric feature
    feature_sample_rows: int = 20_000  # training rows sampled (whole shards, then rows) for feature PSI

    def __post_init__(self) -> None:
        problems = []
        if not 0.0 <= self.recall_margin < 1.0:
            problems.append(f"recall_margin must be in [0, 1), got {self.recall_margin}")
        if not 0.0 <= self.confidence < 1.0:
            problems.append(f"confidence must be in [0, 1) (0: compare the point estimate), got {self.confidence}")
        if self.degraded_after_days < 1:
            problems.append(f"degraded_after_days must be >= 1, got {self.degraded_after_days}")
        if not 0.0 <= self.auc_margin < 0.5:
            problems.append(f"auc_margin must be in [0, 0.5) (0: off), got {self.auc_margin}")
        if self.auc_min_frauds < 2:
            problems.append(f"auc_min_frauds must be >= 2 (an AUC bound needs two frauds), got {self.auc_min_frauds}")
        if self.missed_fraud_factor != 0.0 and self.missed_fraud_factor <= 1.0:
            problems.append(f"missed_fraud_factor must be 0 (off) or > 1 (a multiple of the validation split's rate), "
                            f"got {self.missed_fraud_factor}")
        if self.min_frauds < 1:
            problems.append(f"min_frauds must be >= 1, got {self.min_frauds}")
        if self.alert_rate_band <= 0.0:
            problems.append(f"alert_rate_band must be > 0 (a share of the budget), got {self.alert_rate_band}")
        if self.score_psi_warn <= 0.0 or self.feature_psi_warn <= 0.0:
            problems.append("score_psi_warn and feature_psi_warn must be > 0")
        if self.stuck_feature_share != 0.0 and not 0.5 < self.stuck_feature_share <= 1.0:
            problems.append(f"stuck_feature_share must be 0 (off) or in (0.5, 1], got {self.stuck_feature_share}")
        not_codes = sorted(set(self.segment_features) - set(fd.CATEGORICAL_FEATURES))
        if not_codes:
            problems.append(f"segment_features must be code features ({', '.join(fd.CATEGORICAL_FEATURES)}), "
                            f"unknown: {', '.join(not_codes)}")
        if not 0.0 <= self.segment_kept < 1.0:
            problems.append(f"segment_kept must be in [0, 1) (0: off), got {self.segment_kept}")
        unknown = sorted(set(self.range_features) - set(fd.NUMERIC_FEATURES))
        if unknown:
            problems.append(f"range_features must be numeric features, unknown: {', '.join(unknown)}")
        if not 0.0 <= self.out_of_range_share < 1.0:
            problems.append(f"out_of_range_share must be in [0, 1) (0: off), got {self.out_of_range_share}")
        if self.feature_bins < 2:
            problems.append(f"feature_bins must be >= 2, got {self.feature_bins}")
        if self.feature_sample_rows < 100:
            problems.append(f"feature_sample_rows must be >= 100, got {self.feature_sample_rows}")
        if problems:
            raise ConfigError("monitoring.toml: " + "; ".join(problems))


def load_monitoring_config(env: str | None = None, path: Path | None = None) -> MonitoringConfig:
    return load_section(MonitoringConfig, "monitoring", env, path)
