"""The promotion decision: a pure function of both models' holdout metrics and the gate config.

No I/O: :mod:`pipeline.registry.promotion` scores the models and acts on the :class:`Decision`.

Metric keys read from the mappings (as produced by :func:`pipeline.registry.holdout.holdout_metrics`):
``auc_roc``, ``average_precision``, ``ece``, ``n_fraud``, ``nan_share``; the challenger's mapping also
carries ``psi`` (its score distribution vs the champion's on the same rows) when there is a champion.
A NaN metric never passes a check: missing evidence is never read as good evidence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeline.registry.config import GateConfig, Guardrail

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
    challenger: Mapping[str, float], champion: Mapping[str, float] | None, config: GateConfig
) -> Decision:
    """Decide whether the challenger replaces the champion (``champion=None``: first model ever)."""
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
        _compare_with_champion(checks, challenger, champion, config)
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


def _compare_with_champion(
    checks: _Checks, challenger: Mapping[str, float], champion: Mapping[str, float], config: GateConfig
) -> None:
    auc, champ_auc = _get(challenger, "auc_roc"), _get(champion, "auc_roc")
    target = champ_auc + config.min_auc_delta
    checks.require(
        auc >= target,
        f"AUC-ROC {auc:.4f} >= champion {champ_auc:.4f} + {config.min_auc_delta:g}",
        f"AUC-ROC {auc:.4f} is below champion {champ_auc:.4f} + {config.min_auc_delta:g}",
    )
    ap, champ_ap = _get(challenger, "average_precision"), _get(champion, "average_precision")
    tol = config.ap_tolerance.value
    checks.guard(
        config.ap_tolerance, ap >= champ_ap - tol,
        f"average precision {ap:.4f} >= champion {champ_ap:.4f} - {tol:g}",
        f"average precision {ap:.4f} dropped more than {tol:g} below champion {champ_ap:.4f}",
    )
    psi = _get(challenger, "psi")
    limit = config.psi_limit.value
    checks.guard(config.psi_limit, psi <= limit, f"score PSI vs champion {psi:.4f} <= {limit:g}",
                 f"score shift: PSI vs champion {psi:.4f} above the limit {limit:g}")
