"""The stages of a night, each runnable alone and idempotent on re-run.

Each takes the config slice it needs and the previous stage's record, calls the job a person
would run by hand, records its output in the night's ledger and returns it:

=========  ==========================================  =====================  ==================================
stage      job                                         input                  re-run
=========  ==========================================  =====================  ==================================
ingest     ``jobs/ingest.py --run-date D`` (Spark)     run date               empty Kafka read, same dataset bytes
                                                                              -> same version (content hash)
train      ``torchrun jobs/train.py`` (launch.py)      PublishedDataset       run ``nightly-<version>`` finished:
                                                                              nothing launched; unfinished: resumes
register   ``fraudctl register``                       TrainedRun             the version already made from it
gate       ``fraudctl promote``                        RegisteredModel +      the recorded decision
                                                       PublishedDataset
monitor    ``fraudctl monitor --date D - maturity``    run date (after the    the same report and history entry,
                                                       gate)                  nothing logged or rolled back twice
=========  ==========================================  =====================  ==================================

The DAG's ingest task spark-submits the job itself and turns its report into the same record
(:meth:`PublishedDataset.from_ingest_report`). Each job publishes atomically (manifest, summary,
version, decision), and the ledger record is written only after it, so a stage that fails leaves
nothing the next stage could mistake for its output. Expected failures raise :class:`StageFailed`
with the job's own message; anything else is a bug and keeps its traceback. A degraded live model
is the monitor's finding, not a failure: its record says so and the night goes on.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config import ConfigError
from pipeline.jsonable import nan_to_none
from pipeline.nightly.records import (
    GateOutcome,
    MonitoredVersion,
    MonitorOutcome,
    NightLedger,
    NightReport,
    PublishedDataset,
    RegisteredModel,
    TrainedRun,
)
from pipeline.training.launch import Torchrun
from pipeline.training.run_dir import RunDir, RunSummary

if TYPE_CHECKING:  # the config modules of ingest import Spark: the DAG files import this module
    from pipeline.ingest.config import IngestConfig
    from pipeline.ingest.progress import Progress
    from pipeline.kafka.settings import KafkaConfig
    from pipeline.monitoring.config import MonitoringConfig
    from pipeline.monitoring.monitor import MonitorSources
    from pipeline.monitoring.report import MonitorReport
    from pipeline.registry.config import RegistryConfig

RUN_NAME_PREFIX = "nightly-"


class StageFailed(RuntimeError):
    """A stage's job failed; the message is the job's own, ``stage`` names the stage."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(f"{stage} failed: {message}")
        self.stage = stage


def run_name_for(dataset: PublishedDataset) -> str:
    """One training run per dataset version: a re-run of the night finds its run, a new version gets a new one."""
    return f"{RUN_NAME_PREFIX}{dataset.version}"


# ---- ingest ---------------------------------------------------------------------------------------


def ingest(config: IngestConfig, kafka: KafkaConfig, run_date: date, ledger: NightLedger,
           progress: Progress | None = None) -> PublishedDataset:
    """Kafka -> raw store -> the dataset with label cutoff ``run_date``, in this process's Spark session."""
    from pipeline.ingest.job import failure_message, run_nightly

    try:
        report = run_nightly(config, kafka, run_date, progress=progress)
    except Exception as exc:  # noqa: BLE001 - the ingest job's expected failures carry an operator message
        message = failure_message(exc)
        if message is None:
            raise
        raise StageFailed("ingest", message) from exc
    return record_ingest(report.to_dict(), ledger)


def record_ingest(report: dict, ledger: NightLedger) -> PublishedDataset:
    """The ingest record from the job's report (``IngestReport.to_dict()``), written to the ledger."""
    dataset = PublishedDataset.from_ingest_report(json.loads(json.dumps(report, default=str)))
    ledger.write(dataset)
    return dataset


# ---- train ----------------------------------------------------------------------------------------


def train(train_env: str | None, torchrun: Torchrun, dataset: PublishedDataset, ledger: NightLedger) -> TrainedRun:
    """Train on ``dataset`` into ``<state>/runs/nightly-<version>`` (a finished run is reused, an
    unfinished one resumes), the train.toml pinned in the ledger."""
    from pipeline.training.launch import TrainingJobFailed, train_pinned

    run = RunDir.named(run_name_for(dataset))
    try:
        pinned = train_pinned(run, dataset.root, dataset.version, ledger.train_config, torchrun, env=train_env)
    except (TrainingJobFailed, ConfigError) as exc:
        raise StageFailed("train", str(exc)) from exc
    summary = pinned.summary
    if summary.dataset is not None and summary.dataset.version != dataset.version:
        raise StageFailed("train", f"{run.path} holds a run on dataset version {summary.dataset.version}, not "
                                   f"{dataset.version}: move it away and re-run the stage")
    trained = trained_run(run, summary, dataset.version, pinned.reused)
    ledger.write(trained)
    return trained


def trained_run(run: RunDir, summary: RunSummary, dataset_version: str, reused: bool) -> TrainedRun:
    return TrainedRun(run_dir=str(run.path), dataset_version=dataset_version, best_epoch=summary.best_epoch,
                      best_metrics=dict(summary.best_metrics), world_size=summary.world_size,
                      compression=_compression(summary), bytes_sent_total=summary.bytes_sent_total,
                      bytes_dense_total=summary.bytes_dense_total, wall_s=summary.wall_s, reused=reused)


def _compression(summary: RunSummary) -> str:
    c = summary.compression
    return c.method if c.density is None else f"{c.method} density {c.density:g}"


# ---- register and gate ----------------------------------------------------------------------------


def register(registry: RegistryConfig, trained: TrainedRun, ledger: NightLedger) -> RegisteredModel:
    """Log the run to MLflow and register it as ``challenger`` (an already registered run: its version)."""
    from pipeline.registry.errors import RegistryError
    from pipeline.registry.tracking import register_run

    try:
        version = register_run(Path(trained.run_dir), registry)
    except (RegistryError, ConfigError) as exc:
        raise StageFailed("register", f"{type(exc).__name__}: {exc}") from exc
    registered = RegisteredModel(model_name=registry.model_name, version=version, run_dir=trained.run_dir)
    ledger.write(registered)
    return registered


def gate(registry: RegistryConfig, registered: RegisteredModel, dataset: PublishedDataset,
         ledger: NightLedger) -> GateOutcome:
    """Gate the night's challenger against the champion on the night's holdout (``fraudctl promote``).

    Refuses to gate when ``challenger`` no longer names the night's version: another registration
    came in between, and its model is not this night's to judge.
    """
    from pipeline.evaluation.errors import EvaluationError
    from pipeline.evaluation.report import ALREADY_CHAMPION, format_gate_report
    from pipeline.registry.errors import RegistryError
    from pipeline.registry.promotion import run_gate
    from pipeline.registry.store import CHALLENGER, CHAMPION, connect, version_by_alias

    name = registry.model_name
    try:
        client = connect(registry)
        challenger = version_by_alias(client, name, CHALLENGER)
        if challenger is None or int(challenger.version) != registered.version:
            current = f"v{challenger.version}" if challenger else "unset"
            raise StageFailed("gate", f"{CHALLENGER} of {name} is {current}, not v{registered.version} registered "
                                      f"from {registered.run_dir}: re-run this night's register stage to gate it")
        report = run_gate(registry, Path(dataset.root), dataset_version=dataset.version)
        champion = version_by_alias(client, name, CHAMPION)
    except (RegistryError, EvaluationError, ConfigError) as exc:
        raise StageFailed("gate", f"{type(exc).__name__}: {exc}") from exc
    if report.outcome == ALREADY_CHAMPION:
        earlier = _earlier_promotion(ledger, registered.version)
        if earlier is not None:  # a re-run of a night that promoted: keep the decision it recorded
            return earlier
    gated = json.loads(report.to_json())  # metrics with NaN as null: undefined on this holdout
    outcome = GateOutcome(
        outcome=report.outcome, promoted=report.decision.promote, challenger_version=report.challenger_version,
        compared_with=report.champion_version, champion_version=int(champion.version) if champion else None,
        reasons=report.decision.reasons, warnings=report.decision.warnings,
        challenger_metrics=gated["challenger_metrics"], champion_metrics=gated["champion_metrics"],
        replayed=report.replayed, text=format_gate_report(report))
    ledger.write(outcome)
    return outcome


def _earlier_promotion(ledger: NightLedger, version: int) -> GateOutcome | None:
    if not ledger.record_path(GateOutcome).is_file():
        return None
    earlier = ledger.read(GateOutcome)
    promoted_here = earlier.promoted and earlier.challenger_version == version
    return dataclasses.replace(earlier, replayed=True) if promoted_here else None


# ---- monitor --------------------------------------------------------------------------------------


def monitored_date(run_date: date, label_maturity_days: int) -> date:
    """The day a night monitors: the latest whose fraud reports have matured by the run date."""
    return run_date - timedelta(days=label_maturity_days)


def monitor(config: MonitoringConfig, where: MonitorSources, run_date: date, ledger: NightLedger) -> MonitorOutcome:
    """``fraudctl monitor`` for the night's monitored day; no scores for it: "nothing to monitor"."""
    from pipeline.kafka.admin import KafkaUnavailable
    from pipeline.monitoring.history import MonitoringStateError
    from pipeline.monitoring.monitor import LabelsNotMature, run_monitor
    from pipeline.registry.errors import RegistryError

    try:
        report = run_monitor(monitored_date(run_date, where.label_maturity_days), config, where)
    except (LabelsNotMature, KafkaUnavailable, RegistryError, MonitoringStateError, ConfigError) as exc:
        raise StageFailed("monitor", f"{type(exc).__name__}: {exc}") from exc
    outcome = monitor_outcome(report)
    ledger.write(outcome)
    return outcome


def monitor_outcome(report: MonitorReport) -> MonitorOutcome:
    from pipeline.monitoring.report import describe

    versions = tuple(MonitoredVersion(
        version=v.version, state=v.state, rows=v.figures.at_operating_points.rows,
        frauds=v.figures.at_operating_points.frauds, recall=nan_to_none(v.figures.at_operating_points.recall),
        expected_recall=v.day.expected_recall, review_rate=nan_to_none(v.figures.at_operating_points.review_rate),
        review_budget=v.figures.review_budget) for v in report.versions)
    return MonitorOutcome(monitored_date=report.date, state=report.state, exit_code=report.exit_code,
                          versions=versions, rollbacks=tuple(f"v{r.version}: {r.detail}" for r in report.rollbacks),
                          report=report.report_path, text="\n".join(describe(report)))


# ---- report ---------------------------------------------------------------------------------------


def report(run_date: date, dataset: PublishedDataset, trained: TrainedRun, registered: RegisteredModel,
           outcome: GateOutcome, monitored: MonitorOutcome | None, ledger: NightLedger) -> NightReport:
    """The night in one record, ``report.json`` in the ledger (the summary people and the DAG read)."""
    night = NightReport(run_date.isoformat(), dataset, trained, registered, outcome, monitored)
    ledger.write(night)
    return night
