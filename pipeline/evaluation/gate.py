"""The promotion decision: a pure function of both models' holdout metrics, their paired
comparison and the gate config.

No I/O: :mod:`pipeline.registry.promotion` scores the models and acts on the :class:`Decision`.

Metric keys read from the mappings (as produced by :func:`pipeline.evaluation.holdout.holdout_metrics`
and :func:`pipeline.evaluation.comparison.budget_metrics`): ``auc_roc``, ``average_precision``,
``recall_at_budget``, ``ece``, ``n_fraud``, ``nan_share``. Against a champion, AUC-ROC, average
precision and recall at the review budget are judged on the paired intervals of the
:class:`Comparison`, never on the two point estimates: the challenger is blocked only when the whole
interval of (challenger - champion) lies below ``-margin``. Recall at the budget is what the review
team sees: a model can rank better overall (AUC) and still find fewer frauds in the share of payments
the team can look at; that loss is reported as a failed ``budget_recall_margin`` guardrail, blocking
or warning as its mode says. Precision at the budget is reported, not judged: at the same flagged
share it moves with recall. The burden of proof is on rejecting: a fresher model has seen the newest
fraud, so a difference the holdout cannot resolve keeps it. A NaN metric or a missing interval never
passes a check: missing evidence is never read as good evidence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeline.decisions.operating_points import OperatingPoints
from pipeline.evaluation.comparison import Comparison
from pipeline.evaluation.config import GateConfig, Guardrail
from pipeline.metrics import PairedDifference

INSUFFICIENT_EVIDENCE = "insufficient evidence"


@dataclass(frozen=True)
class Decision:
    """``promote``; ``reasons`` = the blocking failures when rejected, the passed checks when promoted;
    ``warnings`` = guardrails in ``warn`` mode that failed (reported, not blocking)."""

    promote: bool
    reasons: tuple[str, ...]
    warnings: tuple[str, ...] = ()


@dataclass
class _Checks:
    passed: list[str] = field(default_factory=list)
    blocking: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def require(self, ok: bool, passed: str, failed: str) -> None:
        """A hard rule (AUC comparison, first-model floor): failure always blocks."""
        (self.passed if ok else self.blocking).append(passed if ok else failed)

    def guard(self, rail: Guardrail, ok: bool, passed: str, failed: str) -> None:
        """A guardrail: failure blocks or warns according to its mode."""
        if ok:
            self.passed.append(passed)
        elif rail.mode == "block":
            self.blocking.append(failed)
        else:
            self.warnings.append(f"{failed} (guardrail in warn mode)")


def _get(metrics: Mapping[str, float], key: str) -> float:
    value = metrics.get(key)
    return float("nan") if value is None else float(value)


def should_promote(
    challenger: Mapping[str, float], champion: Mapping[str, float] | None, config: GateConfig,
    comparison: Comparison | None = None,
) -> Decision:
    """Decide whether the challenger replaces the champion (``champion=None``: first model ever).

    ``comparison`` (challenger - champion on the same rows) is required when there is a champion.
    """
    if champion is not None and comparison is None:
        raise ValueError("a gate against a champion needs the paired comparison of both models")
    checks = _Checks()
    nan_share = _get(challenger, "nan_share")
    checks.guard(
        config.max_nan_share, nan_share <= config.max_nan_share.value,
        f"NaN scores {nan_share:.2%} <= {config.max_nan_share.value:.2%}",
        f"NaN scores: {nan_share:.2%} of holdout rows (limit {config.max_nan_share.value:.2%})",
    )
    n_fraud = _get(challenger, "n_fraud")
    need = config.min_holdout_frauds.value
    checks.guard(
        config.min_holdout_frauds, n_fraud >= need,
        f"holdout frauds {n_fraud:.0f} >= {need:.0f}",
        f"{INSUFFICIENT_EVIDENCE}: {n_fraud:.0f} frauds in the holdout, need {need:.0f}",
    )
    auc = _get(challenger, "auc_roc")
    if math.isnan(auc):
        checks.blocking.append(f"{INSUFFICIENT_EVIDENCE}: challenger AUC-ROC is undefined on this holdout")
    elif champion is None:
        floor = config.first_model_auc_floor
        checks.require(auc >= floor, f"first model: AUC-ROC {auc:.4f} >= floor {floor:.4f}",
                       f"first model: AUC-ROC {auc:.4f} below the floor {floor:.4f}")
    else:
        _compare_with_champion(checks, challenger, champion, comparison, config)
    ece = _get(challenger, "ece")
    checks.guard(config.ece_limit, ece <= config.ece_limit.value,
                 f"ECE {ece:.4f} <= {config.ece_limit.value:.4f}",
                 f"calibration: ECE {ece:.4f} above the limit {config.ece_limit.value:.4f}")
    promote = not checks.blocking
    return Decision(
        promote=promote,
        reasons=tuple(checks.passed if promote else checks.blocking),
        warnings=tuple(checks.warnings),
    )


def _compare_with_champion(checks: _Checks, challenger: Mapping[str, float], champion: Mapping[str, float],
                           comparison: Comparison, config: GateConfig) -> None:
    auc, champ_auc = _get(challenger, "auc_roc"), _get(champion, "auc_roc")
    diff, margin = comparison.auc_roc, config.auc_margin
    checks.require(
        _not_worse(diff, margin),
        f"AUC-ROC {auc:.4f} vs champion {champ_auc:.4f}: {describe(diff)}, not shown worse by more than {margin:g}",
        _worse_message("AUC-ROC", auc, champ_auc, diff, margin),
    )
    ap, champ_ap = _get(challenger, "average_precision"), _get(champion, "average_precision")
    diff, tol = comparison.average_precision, config.ap_tolerance.value
    checks.guard(
        config.ap_tolerance, _not_worse(diff, tol),
        f"average precision {ap:.4f} vs champion {champ_ap:.4f}: {describe(diff)}, not shown worse by more than {tol:g}",
        _worse_message("average precision", ap, champ_ap, diff, tol),
    )
    _compare_at_budget(checks, challenger, champion, comparison, config)
    psi, limit = comparison.psi, config.psi_limit.value
    checks.guard(config.psi_limit, psi <= limit, f"score PSI vs champion {psi:.4f} <= {limit:g}",
                 f"score shift: PSI vs champion {psi:.4f} above the limit {limit:g}")


def _compare_at_budget(checks: _Checks, challenger: Mapping[str, float], champion: Mapping[str, float],
                       comparison: Comparison, config: GateConfig) -> None:
    budget = comparison.review_budget
    metric = "recall at the review budget" + ("" if budget is None else f" (top {budget:.2%} of payments)")
    recall, champ_recall = _get(challenger, "recall_at_budget"), _get(champion, "recall_at_budget")
    diff, margin = comparison.recall_at_budget, config.budget_recall_margin.value
    checks.guard(
        config.budget_recall_margin, _not_worse(diff, margin),
        f"{metric} {recall:.4f} vs champion {champ_recall:.4f}: {describe(diff)}, not shown worse by more than {margin:g}",
        _worse_message(metric, recall, champ_recall, diff, margin),
    )


def comparison_budget(challenger_points: OperatingPoints | None, config: GateConfig) -> tuple[float, str]:
    """The review budget both models are compared at, and where it comes from: the challenger's
    (the budget it would be deployed with), else ``gate.review_rate``."""
    if challenger_points is not None and challenger_points.review_budget is not None:
        return challenger_points.review_budget, "the challenger's operating points"
    why = "no operating points" if challenger_points is None else "explicit thresholds, no budget"
    return config.review_rate, f"gate.review_rate (the challenger has {why})"


def _not_worse(diff: PairedDifference, margin: float) -> bool:
    """Non-inferiority: the interval of (challenger - champion) reaches -margin or above (NaN: False)."""
    return diff.upper >= -margin


def describe(diff: PairedDifference) -> str:
    """``difference -0.0001, 95% CI [-0.0012, +0.0010]``: how reasons and reports show an interval."""
    estimate = "undefined" if math.isnan(diff.estimate) else f"{diff.estimate:+.4f}"
    interval = ("undefined" if math.isnan(diff.lower) or math.isnan(diff.upper)
                else f"[{diff.lower:+.4f}, {diff.upper:+.4f}]")
    return f"difference {estimate}, {diff.confidence:.0%} CI {interval}"


def _worse_message(metric: str, value: float, champion_value: float, diff: PairedDifference, margin: float) -> str:
    if math.isnan(diff.upper):
        return (f"{INSUFFICIENT_EVIDENCE}: no {metric} interval vs the champion on this holdout "
                "(too few frauds among the rows both models scored)")
    return (f"{metric} {value:.4f} is below champion {champion_value:.4f} by more than the margin {margin:g}: "
            f"{describe(diff)} lies entirely below -{margin:g}")
