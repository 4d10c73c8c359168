"""What a gate run decided, in a form that is stored (version tag, JSON artifact) and printed.

Exit codes of ``fraudctl promote`` come from here: 0 promoted (or already champion), 3 rejected.
Errors (exit 1) never produce a report.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pipeline.decisions.operating_points import OperatingPoints, SplitFigures
from pipeline.evaluation.comparison import Comparison
from pipeline.evaluation.gate import Decision, describe
from pipeline.jsonable import nan_to_none

EXIT_PROMOTED = 0
EXIT_REJECTED = 3

PROMOTED = "promoted"
REJECTED = "rejected"
ALREADY_CHAMPION = "already-champion"

SHOWN_METRICS = ("auc_roc", "average_precision", "recall_at_1pct_fpr", "card_precision_at_100",
                 "recall_at_budget", "precision_at_budget", "ece", "nan_share", "n", "n_fraud")


@dataclass(frozen=True)
class OwnThresholds:
    """A version's operating points and what they realise on the gate's holdout (every row; a NaN
    score never flags): the figures its decisions would have had there."""

    points: OperatingPoints
    holdout: SplitFigures

    @staticmethod
    def from_dict(d: dict[str, Any]) -> OwnThresholds:
        figures = {k: math.nan if v is None else v for k, v in d["holdout"].items()}
        return OwnThresholds(OperatingPoints.from_dict(d["points"]), SplitFigures(**figures))


@dataclass(frozen=True)
class GateReport:
    model_name: str
    outcome: str  # PROMOTED | REJECTED | ALREADY_CHAMPION
    challenger_version: int
    champion_version: int | None  # champion the challenger was compared with (None: first model)
    decision: Decision
    challenger_metrics: dict[str, float] = field(default_factory=dict)
    champion_metrics: dict[str, float] | None = None
    comparison: Comparison | None = None  # challenger - champion on the same rows (None: first model)
    holdout: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    decided_at: str = ""
    actor: str = ""
    replayed: bool = False  # True: the recorded decision of an identical earlier gate run
    # The budget recall/precision at budget are compared at, and where it came from (None: a report
    # stored before budgets, or no gate run).
    review_budget: float | None = None
    budget_source: str = ""
    challenger_thresholds: OwnThresholds | None = None  # None: a version without operating points
    champion_thresholds: OwnThresholds | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_PROMOTED if self.decision.promote else EXIT_REJECTED

    def to_json(self) -> str:
        # NaN is not JSON; null says "undefined on this holdout".
        return json.dumps(nan_to_none(asdict(self)), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> GateReport:
        d = json.loads(text)
        d["decision"] = Decision(promote=d["decision"]["promote"], reasons=tuple(d["decision"]["reasons"]),
                                 warnings=tuple(d["decision"]["warnings"]))
        d["notes"] = tuple(d.get("notes", ()))
        d["challenger_metrics"] = _none_to_nan(d.get("challenger_metrics") or {})
        if d.get("champion_metrics") is not None:
            d["champion_metrics"] = _none_to_nan(d["champion_metrics"])
        if d.get("comparison") is not None:
            d["comparison"] = Comparison.from_dict(d["comparison"])
        for key in ("challenger_thresholds", "champion_thresholds"):
            if d.get(key) is not None:
                d[key] = OwnThresholds.from_dict(d[key])
        return GateReport(**d)

    def as_replay(self) -> GateReport:
        return replace(self, replayed=True)


def _none_to_nan(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float("nan") if v is None else v for k, v in metrics.items()}


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def format_gate_report(report: GateReport) -> str:
    """Human-readable summary: holdout, both models' metrics side by side, decision and reasons."""
    h = report.holdout
    champion = f"champion v{report.champion_version}" if report.champion_version else "no champion (first model)"
    lines = [f"Gate {report.model_name}: challenger v{report.challenger_version} vs {champion}"]
    if h:
        lines.append(f"holdout: {h.get('dataset')}@{h.get('version')} {h.get('split')} {h.get('start')}..{h.get('end')}"
                     f" ({h.get('n')} rows, {h.get('n_fraud')} frauds)")
    if report.challenger_metrics:
        lines.append(f"{'metric':<24}{'challenger':>12}{'champion':>12}")
        champ = report.champion_metrics or {}
        for key in SHOWN_METRICS:
            if key in report.challenger_metrics or key in champ:
                lines.append(f"{key:<24}{_fmt(report.challenger_metrics.get(key)):>12}{_fmt(champ.get(key)):>12}")
    lines += _budget_lines(report)
    if report.comparison is not None:
        lines += _comparison_lines(report.comparison)
    verdict = {PROMOTED: f"PROMOTED: v{report.challenger_version} is champion",
               REJECTED: f"REJECTED: champion stays {'v' + str(report.champion_version) if report.champion_version else 'unset'}",
               ALREADY_CHAMPION: f"NOTHING TO DO: v{report.challenger_version} is already champion"}[report.outcome]
    if report.replayed and report.outcome != ALREADY_CHAMPION:
        verdict += f" (recorded decision of an identical gate run at {report.decided_at})"
    lines.append(verdict)
    marker = "+" if report.decision.promote else "x"
    lines += [f"  {marker} {r}" for r in report.decision.reasons]
    lines += [f"  ! {w}" for w in report.decision.warnings]
    lines += [f"  note: {n}" for n in report.notes]
    return "\n".join(lines)


def _budget_lines(report: GateReport) -> list[str]:
    """The budget, then per model its thresholds and what they realise on the holdout."""
    if report.review_budget is None:
        return []
    lines = [f"review budget: top {report.review_budget:.2%} of payments ({report.budget_source})",
             "  recall/precision_at_budget: each model flagging that share of the holdout",
             "operating points, and what each model's own thresholds realise on the holdout:"]
    models = [(f"challenger v{report.challenger_version}", report.challenger_thresholds)]
    if report.champion_version is not None:
        models.append((f"champion v{report.champion_version}", report.champion_thresholds))
    for label, own in models:
        if own is None:
            lines.append(f"  {label}: no operating points (see the notes)")
            continue
        h = own.holdout
        lines += [f"  {label}: {own.points.describe()}",
                  f"  {'':<{len(label)}}  holdout: review rate {h.review_rate:.2%}, recall {_fmt(h.recall)}, "
                  f"precision {_fmt(h.precision)}, block rate {h.block_rate:.2%}"]
    return lines


def _comparison_lines(comparison: Comparison) -> list[str]:
    lines = [f"challenger - champion on the {comparison.n} rows both scored ({comparison.n_fraud} frauds):"]
    diffs = [("auc_roc", comparison.auc_roc), ("average_precision", comparison.average_precision)]
    if comparison.review_budget is not None:
        diffs += [("recall_at_budget", comparison.recall_at_budget),
                  ("precision_at_budget", comparison.precision_at_budget)]
    for key, diff in diffs:
        units = "cards" if diff.method.endswith("clustered") else "rows"
        lines.append(f"  {key:<22}{describe(diff)}  ({diff.method}, {diff.units} {units})")
    lines.append(f"  {'psi':<22}{_fmt(comparison.psi)}")
    return lines
