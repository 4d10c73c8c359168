"""The promotion gate (``fraudctl promote``, the nightly DAG's gate step).

Under the registry lock: resolve ``challenger`` and ``champion``, load the holdout, score both models
on the same rows, compare them with paired intervals (:mod:`pipeline.registry.comparison`), decide
with :func:`pipeline.registry.gate.should_promote`, check the lock is still held, then -- only then --
move the aliases, append the audit record, and store the decision (version tags + a JSON report
artifact on the challenger's run). Any error before that point leaves the registry untouched.

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

from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion

from pipeline.metrics import PairedDifference
from pipeline.registry import audit
from pipeline.registry.aliases import advance_champion
from pipeline.registry.comparison import Comparison, compare_models
from pipeline.registry.config import RegistryConfig
from pipeline.registry.errors import HoldoutError, NoChallenger
from pipeline.registry.gate import Decision, should_promote
from pipeline.registry.holdout import Holdout, holdout_metrics, load_holdout, training_overlap
from pipeline.registry.lock import registry_lock
from pipeline.registry.report import ALREADY_CHAMPION, PROMOTED, REJECTED, GateReport
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
    Raises a RegistryError (champion untouched) when anything needed cannot be read or scored.
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
        report = _evaluate(config, challenger_v, champion, holdout, actor)
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


def _evaluate(config: RegistryConfig, challenger_v: int, champion: ModelVersion | None, holdout: Holdout,
              actor: str) -> GateReport:
    """Score both models on the holdout (all loading/scoring errors surface here) and decide."""
    name = config.model_name
    labels = holdout.labels
    challenger_uri = version_uri(name, challenger_v)
    challenger_scores = score_rows(load_scorer(challenger_uri), challenger_uri, holdout.frame)
    challenger_metrics = holdout_metrics(holdout, challenger_scores)
    champion_v, champion_metrics, comparison, notes = None, None, None, []
    if champion is not None:
        champion_v = int(champion.version)
        champion_uri = version_uri(name, champion_v)
        champion_scores = score_rows(load_scorer(champion_uri), champion_uri, holdout.frame)
        champion_metrics = holdout_metrics(holdout, champion_scores)
        comparison = compare_models(labels, challenger_scores, champion_scores, holdout.card_ids,
                                    config.gate.intervals)
        seen = training_overlap(holdout, champion.tags.get("dataset.splits"))
        if seen:
            notes.append(f"champion v{champion_v} trained on {', '.join(seen)}, which overlaps the holdout: "
                         "its metrics are optimistic, so the comparison favours the champion")
    decision = should_promote(challenger_metrics, champion_metrics, config.gate, comparison)
    return GateReport(
        model_name=name, outcome=PROMOTED if decision.promote else REJECTED,
        challenger_version=challenger_v, champion_version=champion_v, decision=decision,
        challenger_metrics=challenger_metrics, champion_metrics=champion_metrics, comparison=comparison,
        holdout=holdout.describe(), notes=tuple(notes),
        decided_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), actor=actor,
    )


def _metric_tags(prefix: str, metrics: dict[str, float]) -> dict[str, str]:
    return {f"{prefix}{k}": f"{metrics[k]:.6f}" for k in ("auc_roc", "average_precision", "ece") if k in metrics}


def _comparison_tags(comparison: Comparison | None) -> dict[str, str]:
    """``gate.diff_<metric>`` with ``_lower`` / ``_upper`` (challenger - champion) and ``gate.psi``."""
    if comparison is None:
        return {}
    tags = {"gate.psi": f"{comparison.psi:.6f}"}
    diffs: dict[str, PairedDifference] = {"auc_roc": comparison.auc_roc,
                                          "average_precision": comparison.average_precision}
    for metric, diff in diffs.items():
        tags[f"gate.diff_{metric}"] = f"{diff.estimate:.6f}"
        tags[f"gate.diff_{metric}_lower"] = f"{diff.lower:.6f}"
        tags[f"gate.diff_{metric}_upper"] = f"{diff.upper:.6f}"
        tags[f"gate.diff_{metric}_method"] = f"{diff.method} {diff.confidence:.0%} over {diff.units}"
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
        "gate.reasons": reason[:5000],
    }
    for tag, value in summary.items():
        client.set_model_version_tag(name, version, tag, value)
    if challenger.run_id:
        client.log_text(challenger.run_id, report.to_json(), f"gate/{key[len(GATE_TAG_PREFIX):]}.json")
    client.set_model_version_tag(name, version, key, report.to_json())
