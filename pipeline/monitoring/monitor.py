"""``fraudctl monitor --date D`` and the nightly ``monitor`` stage: how the live models did on day ``D``.

Day ``D`` means the payments whose event date is ``D``, judged with the fraud reports made before
the end of ``D + label_maturity_days`` (an unreported payment is genuine once that has passed, as
the datasets say). A day whose labels have not matured in the raw store yet is refused
(:class:`LabelsNotMature`, exit 5) before anything is read or written. The nightly stage monitors
``run date - label_maturity_days``, whose reports ingest has just landed.

Order of effects, under the monitoring lock:

1. read the scores topic (all of it) and the raw store's reports of ``D .. D + maturity`` and
   payments of ``D``; join them (:mod:`~pipeline.monitoring.join`): nothing is dropped uncounted;
2. per model version that decided payments of ``D``: its reference from the registry, its figures,
   the day's entry in its history, its state (:mod:`~pipeline.monitoring.history`);
3. ``auto_rollback`` (opt-in): a degraded version that is still champion is rolled back to
   ``previous-champion`` by the registry's audited rollback, the reason naming the day and figures;
   once per version and day (a re-run finds the audit record);
4. ``<state>/monitoring/D/report.png`` and ``report.json`` (atomic, the report last);
5. the figures on each version's MLflow run, step = the date (idempotent, :mod:`~pipeline.monitoring.tracking`).

No scores topic, or no decision with thresholds on a payment of ``D``: the report says
``nothing_to_monitor`` and the registry is not touched. A re-run of a day rewrites its report and
history entry from the same inputs, and logs nothing twice.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.kafka.settings import KafkaConfig
from pipeline.monitoring import sources
from pipeline.monitoring.config import MonitoringConfig
from pipeline.monitoring.figures import VersionReference, version_figures
from pipeline.monitoring.history import (
    HistoryStore,
    days_below_in_a_row,
    judge_day,
    monitor_lock,
    version_state,
)
from pipeline.monitoring.join import DayDecisions, first_decisions, label_payments, payment_accounting
from pipeline.monitoring.report import (
    PLOT_FILE,
    REPORT_FILE,
    MonitorReport,
    RollbackOutcome,
    VersionReport,
    write_report,
)
from pipeline.paths import state_dir
from pipeline.registry.config import RegistryConfig
from pipeline.serving.features import EPOCH, US

if TYPE_CHECKING:
    from mlflow import MlflowClient

MONITORING_DIR = "monitoring"  # <state>/monitoring/<date>/, <state>/monitoring/history/
ROLLBACK_ACTOR = "fraudctl-monitor"


class LabelsNotMature(RuntimeError):
    """The raw store does not hold the day's label maturity period yet (``fraudctl monitor`` exits 5)."""


@dataclass(frozen=True)
class MonitorSources:
    """Where the monitor reads (the slices of kafka.toml, serving.toml, ingest.toml, registry.toml it needs)."""

    kafka: KafkaConfig
    scores_topic: str
    raw_root: Path
    label_maturity_days: int
    registry: RegistryConfig

    @classmethod
    def load(cls, env: str | None, bootstrap_servers: str | None = None) -> MonitorSources:
        import dataclasses

        from pipeline.ingest.config import load_ingest_config
        from pipeline.kafka.settings import load_kafka_config
        from pipeline.registry.config import load_registry_config
        from pipeline.serving.config import load_serving_config

        ingest = load_ingest_config(env)
        kafka = load_kafka_config(env)
        if bootstrap_servers:
            kafka = dataclasses.replace(kafka, bootstrap_servers=bootstrap_servers)
        return cls(kafka, load_serving_config(env).scores.topic, ingest.raw.root(), ingest.dataset.label_maturity_days,
                   load_registry_config(env))


def monitoring_root() -> Path:
    return state_dir() / MONITORING_DIR


def report_path(day: date) -> Path:
    return monitoring_root() / day.isoformat() / REPORT_FILE


def labels_cutoff(day: date, maturity_days: int) -> datetime:
    """Reports made before this instant label the payments of ``day``: the end of ``day + maturity``, UTC."""
    return datetime.combine(day + timedelta(days=maturity_days + 1), time(0), tzinfo=UTC)


def check_mature(day: date, maturity_days: int, raw_until: date | None) -> None:
    """Raise LabelsNotMature unless the raw store's payments reach ``day + maturity`` (ingest's backfill rule)."""
    needed = day + timedelta(days=maturity_days)
    if raw_until is not None and raw_until >= needed:
        return
    holds = "is empty" if raw_until is None else f"ends on {raw_until}"
    latest = "" if raw_until is None else f", or monitor {raw_until - timedelta(days=maturity_days)} or earlier"
    raise LabelsNotMature(f"the fraud reports of {day} mature on {needed} (label_maturity_days {maturity_days} in "
                          f"ingest.toml), but the raw store {holds}: ingest up to {needed} first{latest}")


def run_monitor(day: date, config: MonitoringConfig, where: MonitorSources) -> MonitorReport:
    """Monitor ``day`` (see the module doc for the order of effects); returns what report.json holds."""
    raw_until = sources.raw_store_until(where.raw_root)
    check_mature(day, where.label_maturity_days, raw_until)
    cutoff = labels_cutoff(day, where.label_maturity_days)
    root = monitoring_root()
    history = HistoryStore(root)
    with monitor_lock(root):
        records = sources.read_scores(where.kafka, where.scores_topic)
        decisions = first_decisions(records or [], day)
        reports = sources.read_reports(where.raw_root, day, day + timedelta(days=where.label_maturity_days))
        labels, report_accounting = label_payments(decisions, reports, (cutoff - EPOCH) // US)
        cards = sources.payment_cards(where.raw_root, day)
        payments = payment_accounting(decisions, list(cards))
        client = _connect(where.registry) if decisions.payments else None  # nothing decided: registry untouched
        judged = _judge_versions(client, day, decisions, labels, cards, config, where.registry.model_name,
                                 history) if client else []
        versions = tuple(v for v, _ in judged)
        rollbacks = _auto_rollback(client, day, versions, where.registry) if client and config.auto_rollback else ()
        out = root / day.isoformat()
        plot = _plot(out / PLOT_FILE, judged, decisions, config, history, where.registry.model_name)
        report = MonitorReport(
            date=day.isoformat(), model_name=where.registry.model_name, label_maturity_days=where.label_maturity_days,
            labels_reported_before=cutoff.isoformat(), raw_store_until=str(raw_until), scores_topic=where.scores_topic,
            topic_found=records is not None, scores=decisions.accounting, reports=report_accounting,
            payments=payments, versions=versions, config=config, rollbacks=rollbacks,
            report_path=str(out / REPORT_FILE), plot_path=str(plot) if plot else None)
        write_report(report, out / REPORT_FILE)
        if client is not None:
            _log_to_mlflow(client, day, versions, [p for p in (plot, out / REPORT_FILE) if p])
    return report


def _connect(registry: RegistryConfig) -> MlflowClient:
    from pipeline.registry.store import connect

    return connect(registry)


def _by_version(decisions: DayDecisions) -> dict[int, list[int]]:
    rows: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(decisions.payments):
        rows[p.model_version].append(i)
    return dict(sorted(rows.items()))


def _judge_versions(client: MlflowClient, day: date, decisions: DayDecisions, labels: np.ndarray,
                    cards: dict[str, str], config: MonitoringConfig, model_name: str,
                    history: HistoryStore) -> list[tuple[VersionReport, VersionReference]]:
    judged = []
    for version, rows in _by_version(decisions).items():
        reference = sources.version_reference(client, model_name, version, config.feature_sample_rows)
        figures = version_figures([decisions.payments[i] for i in rows], labels[rows], reference, config, cards)
        at = figures.at_operating_points
        entry = judge_day(day, at.frauds, None if math.isnan(at.recall) else at.recall, reference.expected_recall, config,
                          figures.stuck_features, figures.out_of_range_features,
                          (figures.auc_roc, figures.auc_upper), reference.ranking.auc if reference.ranking else None,
                          figures.missed)
        streak = days_below_in_a_row(history.record(model_name, version, entry), day)
        judged.append((VersionReport(figures, entry, version_state(entry, streak, config), streak, reference.run_id,
                                     reference.expected_recall_source, reference.training_sample), reference))
    return judged


def why_degraded(v: VersionReport) -> str:
    """The degraded rule's evidence for version report ``v``: broken inputs, a recall below its floor."""
    d, reasons = v.day, []
    if d.broken_features:
        reasons.append(f"served features stuck at one value (broken inputs): {', '.join(d.broken_features)}")
    if d.out_of_range_features:
        reasons.append(f"served features outside their training range (broken inputs): "
                       f"{', '.join(d.out_of_range_features)}")
    if d.recall_below and d.recall is not None and d.recall_floor is not None and d.expected_recall is not None:
        upper = d.recall_upper
        bound = f" (upper confidence bound {upper:.3f})" if upper is not None and upper != d.recall else ""
        reasons.append(f"realised recall at the operating points {d.recall:.3f}{bound} below the floor "
                       f"{d.recall_floor:.3f} (expected {d.expected_recall:.3f} from {v.expected_recall_source}) on "
                       f"{v.days_below_in_a_row} judged monitored days in a row")
    if d.ranking_below and d.auc is not None and d.auc_upper is not None and d.expected_auc is not None:
        reasons.append(f"the day's ranking of its frauds, AUC {d.auc:.3f} (upper confidence bound {d.auc_upper:.3f}), "
                       f"below the floor {d.auc_floor:.3f} (validation AUC {d.expected_auc:.3f}): frauds scored "
                       f"like genuine payments, e.g. a pattern the model never learned")
    if d.missed_above and d.missed_fraud_ratio is not None and d.missed_fraud_ratio_lower is not None:
        reasons.append(f"{d.missed_fraud_cards} fraud cards got past the model (none of their frauds flagged): "
                       f"{d.missed_fraud_ratio:.2f}x the validation split's rate per payment (lower confidence bound "
                       f"{d.missed_fraud_ratio_lower:.2f}), e.g. a pattern the model never learned")
    return "; ".join(reasons)


def _auto_rollback(client: MlflowClient, day: date, versions: tuple[VersionReport, ...],
                   registry: RegistryConfig) -> tuple[RollbackOutcome, ...]:
    """Roll each degraded version that is still champion back to previous-champion, once per day."""
    from pipeline.registry.aliases import current_champion
    from pipeline.registry.audit import read_history
    from pipeline.registry.errors import ModelLoadError, NoChampion
    from pipeline.registry.rollback import rollback  # loads torch (it checks the target loads): only here

    outcomes = []
    for v in (v for v in versions if v.state == "degraded"):
        marker = f"monitor {day}: v{v.version} degraded"
        earlier = next((r for r in read_history(client, registry.model_name)
                        if r.from_version == v.version and r.reason.startswith(marker)), None)
        champion = current_champion(client, registry.model_name)
        if earlier is not None:
            outcomes.append(RollbackOutcome(v.version, False, f"rolled back earlier: champion v{earlier.from_version} "
                                            f"-> v{earlier.to_version} at {earlier.time} by {earlier.actor}"))
            continue
        if champion != v.version:
            outcomes.append(RollbackOutcome(v.version, False, f"v{v.version} is not champion (champion: "
                                            f"{f'v{champion}' if champion else 'none'}): nothing to roll back"))
            continue
        reason = f"{marker}: {why_degraded(v)}; see {report_path(day)}"
        try:
            record = rollback(registry, None, ROLLBACK_ACTOR, reason)
        except (NoChampion, ModelLoadError) as exc:
            outcomes.append(RollbackOutcome(v.version, False, f"{type(exc).__name__}: {exc}"))
            continue
        outcomes.append(RollbackOutcome(v.version, True, f"champion v{record.from_version} -> v{record.to_version} "
                                        f"({record.action} by {record.actor} at {record.time}): {reason}"))
    return tuple(outcomes)


def _plot(path: Path, judged: list[tuple[VersionReport, VersionReference]], decisions: DayDecisions,
          config: MonitoringConfig, history: HistoryStore, model_name: str) -> Path | None:
    if not judged:
        path.unlink(missing_ok=True)  # a re-run that finds nothing leaves no stale plot beside its report
        return None
    from pipeline.monitoring.plot import write_plot

    rows = _by_version(decisions)
    drawn = [(v, np.array([decisions.payments[i].score for i in rows[v.version]]), ref.validation_scores,
              history.read(model_name, v.version)) for v, ref in judged]
    return write_plot(path, drawn, config.feature_psi_warn)


def _log_to_mlflow(client: MlflowClient, day: date, versions: tuple[VersionReport, ...], artifacts: list[Path]) -> None:
    from pipeline.monitoring.tracking import log_day, version_metrics

    for v in versions:
        if v.run_id:
            log_day(client, v.run_id, day, version_metrics(v), artifacts)
