"""What one monitored day found: the record behind ``report.json``, its state, exit code and text.

States, per version and for the day (the worst version's, in the order below):

=======================  =========================================================  ====
state                    meaning                                                    exit
=======================  =========================================================  ====
``degraded``             recall at the operating points below expectation - margin  4
                         (or the day's AUC below its floor, or its missed fraud
                         cards above a factor of validation's) on
                         ``degraded_after_days`` judged days in a row; or a
                         broken input (stuck, in a segment, out of range)
``ok``                   judged, not degraded                                       0
``unjudged``             enough frauds, but no expectation to compare with          0
``insufficient_evidence``  fewer matured frauds than ``min_frauds``                 0
``nothing_to_monitor``   no scores topic, or no decision on a payment of the day    0
=======================  =========================================================  ====

``fraudctl monitor`` exits with the day's code; labels that have not matured yet exit 5 (see
:mod:`pipeline.monitoring.monitor`), an error 1.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.atomic import write_json_atomic
from pipeline.jsonable import nan_to_none
from pipeline.monitoring.config import MonitoringConfig
from pipeline.monitoring.figures import VersionFigures
from pipeline.monitoring.history import MonitoredDay, VersionState
from pipeline.monitoring.join import PaymentAccounting, ReportAccounting, ScoreAccounting

ReportState = Literal["degraded", "ok", "unjudged", "insufficient_evidence", "nothing_to_monitor"]
SEVERITY: tuple[ReportState, ...] = ("degraded", "ok", "unjudged", "insufficient_evidence", "nothing_to_monitor")
EXIT_OK = 0
EXIT_DEGRADED = 4
EXIT_LABELS_NOT_MATURE = 5
REPORT_FILE = "report.json"
PLOT_FILE = "report.png"


@dataclass(frozen=True)
class VersionReport:
    figures: VersionFigures
    day: MonitoredDay  # the entry written to the version's history
    state: VersionState
    days_below_in_a_row: int
    run_id: str | None
    expected_recall_source: str
    training_sample: str

    @property
    def version(self) -> int:
        return self.figures.version


@dataclass(frozen=True)
class RollbackOutcome:
    version: int  # the degraded champion
    done: bool  # this run moved the champion
    detail: str  # the audit record, or why the champion was not moved


@dataclass(frozen=True)
class MonitorReport:
    date: str
    model_name: str
    label_maturity_days: int
    labels_reported_before: str  # reports made before this instant count (end of date + maturity, UTC)
    raw_store_until: str  # latest payment date of the raw store when the monitor ran
    scores_topic: str
    topic_found: bool
    scores: ScoreAccounting
    reports: ReportAccounting | None  # None: nothing was decided on the day, no report was read
    payments: PaymentAccounting | None
    versions: tuple[VersionReport, ...]
    config: MonitoringConfig
    rollbacks: tuple[RollbackOutcome, ...] = ()
    report_path: str = ""
    plot_path: str | None = None

    @property
    def state(self) -> ReportState:
        states = {v.state for v in self.versions}
        return next((s for s in SEVERITY if s in states), "nothing_to_monitor")

    @property
    def exit_code(self) -> int:
        return EXIT_DEGRADED if self.state == "degraded" else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return nan_to_none({
            "date": self.date, "model_name": self.model_name, "state": self.state, "exit_code": self.exit_code,
            "labels": {"maturity_days": self.label_maturity_days, "reported_before": self.labels_reported_before,
                       "raw_store_until": self.raw_store_until},
            "scores_topic": {"name": self.scores_topic, "found": self.topic_found},
            "accounting": {"score_events": dataclasses.asdict(self.scores),
                           "reports": dataclasses.asdict(self.reports) if self.reports else None,
                           "payments": dataclasses.asdict(self.payments) if self.payments else None},
            "versions": [_version_dict(v, self.config) for v in self.versions],
            "rollbacks": [dataclasses.asdict(r) for r in self.rollbacks],
            "config": dataclasses.asdict(self.config),
            "plot": Path(self.plot_path).name if self.plot_path else None,
        })


def _version_dict(v: VersionReport, config: MonitoringConfig) -> dict[str, Any]:
    f, at = v.figures, v.figures.at_operating_points
    return {
        "version": v.version, "state": v.state, "run_id": v.run_id, "rows": at.rows, "frauds": at.frauds,
        "auc_roc": f.auc_roc, "average_precision": f.average_precision,
        "at_operating_points": {"review_rate": at.review_rate, "block_rate": at.block_rate, "recall": at.recall,
                                "precision": at.precision, "block_precision": at.block_precision},
        "thresholds": {"review": list(f.review_thresholds), "block": list(f.block_thresholds)},
        "alert_rate": {"review_rate": at.review_rate, "budget": f.review_budget, "ratio": f.review_rate_vs_budget,
                       "band": config.alert_rate_band, "in_band": f.alert_rate_in_band},
        "recall": {"realised": at.recall, "expected": v.day.expected_recall, "expected_source": v.expected_recall_source,
                   "margin": config.recall_margin, "floor": v.day.recall_floor, "confidence": config.confidence,
                   "upper_bound": v.day.recall_upper, "judged": v.day.judged,
                   "below": v.day.recall_below, "days_below_in_a_row": v.days_below_in_a_row,
                   "degraded_after_days": config.degraded_after_days, "min_frauds": config.min_frauds},
        "missed_frauds": {"cards": v.day.missed_fraud_cards, "ratio_to_validation": v.day.missed_fraud_ratio,
                          "lower_bound": v.day.missed_fraud_ratio_lower, "factor": config.missed_fraud_factor,
                          "above": v.day.missed_above},
        "ranking": {"auc": v.day.auc, "upper_bound": v.day.auc_upper, "expected_auc": v.day.expected_auc,
                    "margin": config.auc_margin, "floor": v.day.auc_floor, "below": v.day.ranking_below},
        "broken_features": {"stuck": list(v.day.broken_features), "stuck_feature_share": config.stuck_feature_share,
                            "segment_features": list(config.segment_features),
                            "segment_kept": config.segment_kept,
                            "out_of_range": list(v.day.out_of_range_features),
                            "range_features": list(config.range_features),
                            "out_of_range_share": config.out_of_range_share},
        "score_psi": f.score_psi,
        "feature_psi": f.feature_psi,
        "feature_psi_sample": {"training": v.training_sample or None, "live_rows": f.live_feature_rows},
        "findings": list(f.findings),
    }


def write_report(report: MonitorReport, path: Path) -> None:
    write_json_atomic(path, report.to_dict())


# ---- text -----------------------------------------------------------------------------------------


def _num(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def describe(report: MonitorReport) -> list[str]:
    """The report as lines for a terminal or a task log."""
    lines = [f"monitor {report.date} of {report.model_name} (reports made before "
             f"{report.labels_reported_before}): {report.state}"]
    s = report.scores
    if not report.topic_found:
        lines.append(f"scores topic {report.scores_topic!r} does not exist: nothing was scored, nothing to monitor")
    else:
        lines.append(f"scores topic {report.scores_topic}: read {s.read} = used {s.used} + other dates {s.other_dates} "
                     f"+ duplicates {s.duplicates} + unparseable {s.unparseable} + without thresholds "
                     f"{s.no_thresholds}; {s.out_of_order} of the day's events out of order")
    if report.reports is not None:
        r = report.reports
        lines.append(f"fraud reports read {r.read}: {r.used} label a monitored payment, {r.superseded} superseded, "
                     f"{r.other_dates} for other dates, {r.without_thresholds} for decisions without thresholds, "
                     f"{r.never_scored} for transactions never scored (no decision on the topic), {r.after_cutoff} after the cutoff")
    if report.payments is not None:
        p = report.payments
        lines.append(f"raw store payments of the day {p.raw_store}: {p.missing_decisions} without a decision on the "
                     f"topic; {p.not_in_raw_store} decided payments not in the raw store")
    for v in report.versions:
        lines += describe_version(v)
    for r in report.rollbacks:
        lines.append(f"auto_rollback v{r.version}: {'done' if r.done else 'not done'}: {r.detail}")
    if report.report_path:
        lines.append(f"report {report.report_path}" + (f", plot {report.plot_path}" if report.plot_path else ""))
    return lines


def describe_version(v: VersionReport) -> list[str]:
    f, at, day = v.figures, v.figures.at_operating_points, v.day
    expected = ("no expectation" if day.expected_recall is None
                else f"expected {day.expected_recall:.3f}, floor {_num(day.recall_floor)}")
    budget = "" if f.review_budget is None else f" (budget {f.review_budget:.2%})"
    top = max(f.feature_psi.items(), key=lambda kv: -math.inf if math.isnan(kv[1]) else kv[1], default=None)
    drift = f"score PSI {_num(f.score_psi)}" + (f", feature PSI max {_num(top[1])} ({top[0]})" if top else "")
    line = (f"v{v.version} {v.state}: {at.rows} payments, {at.frauds} frauds; AUC {_num(f.auc_roc)}, "
            f"AP {_num(f.average_precision)}; at the operating points recall {_num(at.recall)} ({expected}; "
            f"{v.days_below_in_a_row} judged day(s) below in a row), precision {_num(at.precision)}, "
            f"block precision {_num(at.block_precision)}, review rate {_num(at.review_rate, '.2%')}{budget}; {drift}")
    broken = [f"  - broken input (degraded): {', '.join(day.broken_features)} stuck at one value"] \
        if day.broken_features else []
    broken += [f"  - broken input (degraded): {', '.join(day.out_of_range_features)} outside the training range"] \
        if day.out_of_range_features else []
    if day.missed_above:
        broken.append(f"  - {day.missed_fraud_cards} fraud cards got past the model, {_num(day.missed_fraud_ratio, '.2f')}x "
                      f"validation's rate per payment (lower bound {_num(day.missed_fraud_ratio_lower, '.2f')})")
    return [line, *broken, *(f"  - {finding}" for finding in f.findings)]
