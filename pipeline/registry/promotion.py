"""The promotion gate (``fraudctl promote``, the nightly DAG's gate step).

Under the registry lock: resolve ``challenger`` and ``champion``, load the holdout, score both models
on the same rows, compare them with paired intervals (:mod:`pipeline.evaluation.comparison`), decide
with :func:`pipeline.evaluation.gate.should_promote`, check the lock is still held, then -- only then --
move the aliases, append the audit record, and store the decision (version tags + a JSON report
artifact on the challenger's run). Any error before that point leaves the registry untouched.

Both models are compared at one review budget: the challenger's (its operating-points tags), else
``gate.review_rate``. The challenger's version tags then carry ``gate.review_budget``, its
``gate.recall_at_budget`` / ``gate.precision_at_budget``, the paired ``gate.diff_recall_at_budget``
(and precision, with ``_lower`` / ``_upper``), and what its own thresholds realise on the holdout,
``gate.expected_recall`` / ``gate.expected_precision`` / ``gate.expected_review_rate``: the backtest
expectation the live-model monitor judges the served version against.

Idempotence: the decision is stored on the challenger version under a tag keyed by the champion
version and the holdout fingerprint. Re-running the same gate (same challenger, same champion, same
holdout rows) returns that recorded decision without scoring or auditing again; a promoted
challenger is simply "already champion", and one an operator has since rolled back is not promoted
again (exit 3: reinstating it is a deliberate ``fraudctl rollback --to-version``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import numpy as np
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion

from pipeline.decisions.operating_points import (
    EXPECTED_RECALL_TAG,
    OperatingPoints,
    operating_points_from_tags,
    split_figures,
)
from pipeline.evaluation.comparison import Comparison, budget_metrics, compare_models
from pipeline.evaluation.errors import HoldoutError
from pipeline.evaluation.gate import Decision, comparison_budget, should_promote
from pipeline.evaluation.holdout import Holdout, holdout_metrics, load_holdout, training_overlap
from pipeline.evaluation.report import ALREADY_CHAMPION, PROMOTED, REJECTED, GateReport, OwnThresholds
from pipeline.metrics import PairedDifference
from pipeline.registry import audit
from pipeline.registry.aliases import advance_champion
from pipeline.registry.config import RegistryConfig
from pipeline.registry.errors import NoChallenger
from pipeline.registry.lock import registry_lock
from pipeline.registry.scoring import load_scorer, score_rows
from pipeline.registry.store import CHALLENGER, CHAMPION, connect, version_by_alias, version_uri

GATE_TAG_PREFIX = "gate.decision."


def gate_key(champion_version: int | None, holdout_fingerprint: str) -> str:
    return f"{GATE_TAG_PREFIX}vs-{champion_version or 'none'}.holdout-{holdout_fingerprint[:16]}"


def run_gate(config: RegistryConfig, dataset_root: Path | None = None, dataset_version: str | None = None,
             actor: str | None = None) -> GateReport:
    """Gate the ``challenger`` against the ``champion`` and promote it if it passes.

    ``dataset_root`` defaults to the dataset the challenger was trained from (its ``dataset.root``
    tag); the holdout is that root's latest (or ``dataset_version``) ``holdout_split``.
    Raises a RegistryError, or a HoldoutError (an EvaluationError) for an unusable holdout, with the
    champion untouched, when anything needed cannot be read or scored.
    """
    client = connect(config)
    actor = audit.resolve_actor(actor)
    name = config.model_name
    with registry_lock(config) as lock:
        challenger = version_by_alias(client, name, CHALLENGER)
        if challenger is None:
            raise NoChallenger(f"registered model {name!r} has no {CHALLENGER!r} version: "
                               "register a finished training run first (`fraudctl register --run-dir ...`)")
        champion = version_by_alias(client, name, CHAMPION)
        challenger_v = int(challenger.version)
        champion_v = int(champion.version) if champion else None
        if champion_v == challenger_v:
            return GateReport(name, ALREADY_CHAMPION, challenger_v, champion_v,
                              Decision(True, (f"version {challenger_v} is already {CHAMPION}",)), replayed=True)
        holdout = _holdout_for(challenger, dataset_root, dataset_version, config)
        key = gate_key(champion_v, holdout.fingerprint)
        if key in challenger.tags:
            return _replay(GateReport.from_json(challenger.tags[key]))
        report = _evaluate(config, challenger, champion, holdout, actor)
        lock.ensure_held()  # scoring can take long: do not act on a lock another gate has since taken
        _record(client, config, report, challenger, key)
        return report


def _replay(recorded: GateReport) -> GateReport:
    """The recorded decision of an identical gate run. A recorded promotion whose challenger is no
    longer champion was undone by an operator (rollback): repeating it would undo the rollback."""
    if not recorded.decision.promote:
        return recorded.as_replay()
    reason = (f"v{recorded.challenger_version} passed this gate at {recorded.decided_at} and was later rolled "
              f"back; not promoting it again (use `fraudctl rollback --to-version {recorded.challenger_version}`"
              " to reinstate it deliberately)")
    return replace(recorded, outcome=REJECTED, decision=Decision(False, (reason,)), replayed=True)


def _holdout_for(challenger: ModelVersion, dataset_root: Path | None, dataset_version: str | None,
                 config: RegistryConfig) -> Holdout:
    root = dataset_root or challenger.tags.get("dataset.root")
    if not root:
        raise HoldoutError(f"challenger v{challenger.version} records no dataset root: pass --dataset-root")
    holdout = load_holdout(Path(root), config.holdout_split, dataset_version)
    seen = training_overlap(holdout, challenger.tags.get("dataset.splits"))
    if seen:
        raise HoldoutError(
            f"holdout {holdout.window.start}..{holdout.window.end} overlaps the challenger's training data "
            f"({', '.join(seen)}): gate on a dataset whose {config.holdout_split!r} split comes after its training"
        )
    return holdout


def _evaluate(config: RegistryConfig, challenger: ModelVersion, champion: ModelVersion | None, holdout: Holdout,
              actor: str) -> GateReport:
    """Score both models on the holdout (all loading/scoring errors surface here) and decide.

    Both are judged at one review budget, the challenger's (:func:`comparison_budget`); each model's
    own thresholds are also applied to the holdout, for the report and the monitor's expectation."""
    name, labels, notes = config.model_name, holdout.labels, []
    challenger_v = int(challenger.version)
    challenger_points = _operating_points(challenger, "challenger", notes)
    budget, budget_source = comparison_budget(challenger_points, config.gate)
    challenger_scores = _score(name, challenger_v, holdout)
    challenger_metrics = holdout_metrics(holdout, challenger_scores) | budget_metrics(
        labels, challenger_scores, budget, holdout.card_ids, config.gate.intervals)
    champion_v, champion_metrics, comparison, champion_thresholds = None, None, None, None
    if champion is not None:
        champion_v = int(champion.version)
        champion_points = _operating_points(champion, "champion", notes)
        champion_scores = _score(name, champion_v, holdout)
        champion_metrics = holdout_metrics(holdout, champion_scores) | budget_metrics(
            labels, champion_scores, budget, holdout.card_ids, config.gate.intervals)
        comparison = compare_models(labels, challenger_scores, champion_scores, holdout.card_ids,
                                    config.gate.intervals, review_rate=budget)
        champion_thresholds = _own_thresholds(champion_points, labels, champion_scores)
        notes += _champion_notes(holdout, champion, champion_points, budget)
    decision = should_promote(challenger_metrics, champion_metrics, config.gate, comparison)
    return GateReport(
        model_name=name, outcome=PROMOTED if decision.promote else REJECTED,
        challenger_version=challenger_v, champion_version=champion_v, decision=decision,
        challenger_metrics=challenger_metrics, champion_metrics=champion_metrics, comparison=comparison,
        holdout=holdout.describe(), notes=tuple(notes),
        decided_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), actor=actor,
        review_budget=budget, budget_source=budget_source,
        challenger_thresholds=_own_thresholds(challenger_points, labels, challenger_scores),
        champion_thresholds=champion_thresholds,
    )


def _score(name: str, version: int, holdout: Holdout) -> np.ndarray:
    uri = version_uri(name, version)
    return score_rows(load_scorer(uri), uri, holdout.frame)


def _operating_points(version: ModelVersion, role: str, notes: list[str]) -> OperatingPoints | None:
    """The version's operating points; None (with a note) when it has none or they are unreadable:
    the gate still judges it, at ``gate.review_rate`` when it is the challenger."""
    try:
        points = operating_points_from_tags(dict(version.tags))
    except (ValueError, KeyError, TypeError) as exc:
        notes.append(f"{role} v{version.version}'s operating-points tags are unreadable ({type(exc).__name__}: "
                     f"{exc}): judged as a version without operating points")
        return None
    if points is None:
        notes.append(f"{role} v{version.version} has no operating points (registered before they existed)")
    return points


def _own_thresholds(points: OperatingPoints | None, labels: np.ndarray, scores: np.ndarray) -> OwnThresholds | None:
    if points is None:
        return None
    return OwnThresholds(points, split_figures(labels, scores, points.review_threshold, points.block_threshold))


def _champion_notes(holdout: Holdout, champion: ModelVersion, points: OperatingPoints | None,
                    budget: float) -> list[str]:
    notes = []
    seen = training_overlap(holdout, champion.tags.get("dataset.splits"))
    if seen:
        notes.append(f"champion v{champion.version} trained on {', '.join(seen)}, which overlaps the holdout: "
                     "its metrics are optimistic, so the comparison favours the champion")
    if points is not None and points.review_budget is not None and points.review_budget != budget:
        notes.append(f"champion v{champion.version}'s thresholds were chosen for a budget of "
                     f"{points.review_budget:.2%}; both models are compared at {budget:.2%}")
    return notes


BUDGET_METRICS = ("recall_at_budget", "precision_at_budget")


def _metric_tags(prefix: str, metrics: dict[str, float]) -> dict[str, str]:
    keys = ("auc_roc", "average_precision", "ece", *BUDGET_METRICS, "recall_at_budget_lower", "recall_at_budget_upper")
    return {f"{prefix}{k}": f"{metrics[k]:.6f}" for k in keys if k in metrics}


def _comparison_tags(comparison: Comparison | None) -> dict[str, str]:
    """``gate.diff_<metric>`` with ``_lower`` / ``_upper`` (challenger - champion) and ``gate.psi``."""
    if comparison is None:
        return {}
    tags = {"gate.psi": f"{comparison.psi:.6f}"}
    diffs: dict[str, PairedDifference] = {"auc_roc": comparison.auc_roc,
                                          "average_precision": comparison.average_precision,
                                          "recall_at_budget": comparison.recall_at_budget,
                                          "precision_at_budget": comparison.precision_at_budget}
    for metric, diff in diffs.items():
        tags[f"gate.diff_{metric}"] = f"{diff.estimate:.6f}"
        tags[f"gate.diff_{metric}_lower"] = f"{diff.lower:.6f}"
        tags[f"gate.diff_{metric}_upper"] = f"{diff.upper:.6f}"
        tags[f"gate.diff_{metric}_method"] = f"{diff.method} {diff.confidence:.0%} over {diff.units}"
    return tags


def _budget_tags(report: GateReport) -> dict[str, str]:
    """``gate.review_budget`` and, when the challenger has operating points, what its own thresholds
    realised on the holdout: ``gate.expected_recall`` is the live-model monitor's expectation."""
    tags = {} if report.review_budget is None else {"gate.review_budget": f"{report.review_budget:.6g}",
                                                    "gate.review_budget_source": report.budget_source}
    own = report.challenger_thresholds
    if own is not None:
        tags |= {EXPECTED_RECALL_TAG: f"{own.holdout.recall:.6f}",
                 "gate.expected_precision": f"{own.holdout.precision:.6f}",
                 "gate.expected_review_rate": f"{own.holdout.review_rate:.6f}"}
    return tags


def _record(client: MlflowClient, config: RegistryConfig, report: GateReport, challenger: ModelVersion,
            key: str) -> None:
    """Act on the decision. Order: aliases, audit, then the idempotence tag (written last, so a crash
    before it makes a re-run redo the gate rather than skip a step)."""
    name, version = config.model_name, str(report.challenger_version)
    if report.decision.promote:
        advance_champion(client, name, report.challenger_version, report.champion_version)
    reason = "; ".join(report.decision.reasons + report.decision.warnings)
    action = audit.PROMOTE if report.decision.promote else audit.REJECT
    audit.append_record(client, name, audit.new_record(
        action, report.actor, report.champion_version, report.challenger_version, f"gate: {reason}"))
    summary = {
        "gate.outcome": report.outcome,
        "gate.decided_at": report.decided_at,
        "gate.champion_version": str(report.champion_version or "none"),
        "gate.holdout": f"{report.holdout['dataset']}@{report.holdout['version']} "
                        f"{report.holdout['start']}..{report.holdout['end']}",
        **_metric_tags("gate.", report.challenger_metrics),
        **_metric_tags("gate.champion_", report.champion_metrics or {}),
        **_comparison_tags(report.comparison),
        **_budget_tags(report),
        "gate.reasons": reason[:5000],
    }
    for tag, value in summary.items():
        client.set_model_version_tag(name, version, tag, value)
    if challenger.run_id:
        client.log_text(challenger.run_id, report.to_json(), f"gate/{key[len(GATE_TAG_PREFIX):]}.json")
    client.set_model_version_tag(name, version, key, report.to_json())
