"""The gate's config types: guardrails, the paired intervals' settings and the thresholds of the decision.

Loaded as the ``[gate]`` table of ``conf/<env>/registry.toml`` (:mod:`pipeline.registry.config`), and
passed as this slice to the pure evaluation code (:mod:`pipeline.evaluation.gate`,
:mod:`pipeline.evaluation.comparison`), which never reads the registry's storage settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.config import ConfigError

GuardrailMode = Literal["block", "warn"]


@dataclass(frozen=True)
class Guardrail:
    """A threshold and what a failure does: ``block`` rejects the challenger, ``warn`` only reports."""

    value: float
    mode: GuardrailMode = "block"


@dataclass(frozen=True)
class IntervalConfig:
    """How the paired challenger-minus-champion intervals are computed (same rows, both models)."""

    confidence: float = 0.95  # two-sided level of every interval shown and decided on
    bootstrap_resamples: int = 1000  # average precision and the budget metrics: resamples of the holdout's cards
    seed: int = 0  # fixed, so re-running a gate on the same rows gives the same intervals

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"gate.intervals.confidence must be in [0.5, 1), got {self.confidence}")
        if self.bootstrap_resamples < 100:
            raise ConfigError(f"gate.intervals.bootstrap_resamples must be >= 100, got {self.bootstrap_resamples}")


@dataclass(frozen=True)
class GateConfig:
    """Thresholds of the promotion gate (see :func:`pipeline.evaluation.gate.should_promote`).

    Comparisons with the champion are non-inferiority tests on paired intervals: a margin ``m``
    rejects the challenger only when the whole interval of (challenger - champion) lies below ``-m``,
    i.e. when it is worse by more than ``m`` beyond reasonable doubt. Differences inside the noise of
    the holdout never block a fresher model.
    """

    # Largest AUC-ROC loss vs the champion that still counts as "as good" (AUC units, >= 0).
    auc_margin: float = 0.002
    # With no champion yet, the first model must reach this AUC-ROC on the holdout.
    first_model_auc_floor: float = 0.75
    # Largest average-precision loss vs the champion that still counts as "as good" (AP units).
    ap_tolerance: Guardrail = field(default_factory=lambda: Guardrail(0.02))
    # Largest expected calibration error: the scoring service thresholds calibrated probabilities.
    ece_limit: Guardrail = field(default_factory=lambda: Guardrail(0.05))
    # Largest PSI of challenger scores vs champion scores on the holdout (0.25 = "major shift").
    psi_limit: Guardrail = field(default_factory=lambda: Guardrail(0.25))
    # Fewer holdout frauds than this and AUC/AP differences are noise: "insufficient evidence".
    min_holdout_frauds: Guardrail = field(default_factory=lambda: Guardrail(30))
    # Largest share of holdout rows the challenger may score as NaN (0: none at all).
    max_nan_share: Guardrail = field(default_factory=lambda: Guardrail(0.0))
    # Largest loss of recall at the review budget vs the champion that still counts as "as good"
    # (recall units): both models flag the same top share of the holdout, the challenger's budget.
    # Warn unless a config says block: AUC is what the gate always required; rejecting on the budget
    # is a deployment's choice (conf/prod blocks).
    budget_recall_margin: Guardrail = field(default_factory=lambda: Guardrail(0.02, "warn"))
    # The budget both models are compared at when the challenger carries no operating points
    # (registered before they existed, or explicit thresholds): keep it equal to train.toml's
    # [decisions].review_rate, the budget new versions are chosen from.
    review_rate: float = 0.005
    intervals: IntervalConfig = field(default_factory=IntervalConfig)

    def __post_init__(self) -> None:
        if self.auc_margin < 0 or self.ap_tolerance.value < 0 or self.budget_recall_margin.value < 0:
            raise ConfigError("gate.auc_margin, gate.ap_tolerance and gate.budget_recall_margin are margins: "
                              "they must be >= 0")
        if not 0.0 < self.review_rate < 1.0:
            raise ConfigError(f"gate.review_rate is a share of payments: it must be in (0, 1), got {self.review_rate}")
