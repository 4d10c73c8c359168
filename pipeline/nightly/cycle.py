"""The nightly cycle, composed once: ``fraudctl nightly --run-date D`` and ``make demo`` call
:func:`run_cycle`; the Airflow DAG runs the same stages one task each (``airflow_dags/``).

Order of effects: ingest publishes a dataset version, training writes a run directory for it,
registering makes a model version the ``challenger``, the gate moves ``champion`` or records a
rejection, the monitor judges the live versions on the day whose labels have just matured (and,
with ``auto_rollback``, may move ``champion`` back), the report writes the night's summary. A failure stops the cycle at that stage with
:class:`~pipeline.nightly.stages.StageFailed`; re-running the cycle redoes only what is missing
(each stage is idempotent), so "run it again" is always the recovery.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING

from pipeline.ingest.config import IngestConfig
from pipeline.kafka.settings import KafkaConfig
from pipeline.monitoring.config import MonitoringConfig, load_monitoring_config
from pipeline.nightly import stages, text
from pipeline.nightly.config import load_nightly_config
from pipeline.nightly.records import (
    STAGES,
    GateOutcome,
    MonitorOutcome,
    NightLedger,
    NightReport,
    PublishedDataset,
    Record,
    RegisteredModel,
    TrainedRun,
)
from pipeline.registry.config import RegistryConfig, load_registry_config
from pipeline.training.launch import Torchrun

if TYPE_CHECKING:  # the monitor's readers import MLflow: loaded when the stage runs
    from pipeline.monitoring.monitor import MonitorSources

Echo = Callable[[str], None]


@dataclass(frozen=True)
class CycleConfig:
    """The slices the stages read (each stage receives only its own)."""

    train_env: str | None  # conf/<env>/train.toml, pinned per night to the dataset version
    ingest: IngestConfig
    kafka: KafkaConfig
    registry: RegistryConfig
    torchrun: Torchrun
    monitoring: MonitoringConfig
    scores_topic: str  # [scores].topic of serving.toml: where the service published its decisions

    @classmethod
    def load(cls, env: str | None, bootstrap_servers: str | None = None) -> CycleConfig:
        from pipeline.ingest.job import load_job_configs
        from pipeline.serving.config import load_serving_config

        ingest, kafka = load_job_configs(env, bootstrap_servers)
        return cls(env, ingest, kafka, load_registry_config(env), load_nightly_config(env).train,
                   load_monitoring_config(env), load_serving_config(env).scores.topic)

    def monitor_sources(self) -> MonitorSources:
        """Where the monitor stage reads: this cycle's Kafka, raw store and registry."""
        from pipeline.monitoring.monitor import MonitorSources

        return MonitorSources(self.kafka, self.scores_topic, self.ingest.raw.root(),
                              self.ingest.dataset.label_maturity_days, self.registry)


def run_cycle(config: CycleConfig, run_date: date, echo: Echo = print) -> NightReport:
    """Run the night of ``run_date`` end to end and return its report (promoted or rejected alike)."""
    from pipeline.ingest.progress import Progress

    ledger = NightLedger.for_date(run_date)
    echo(f"== nightly cycle for {run_date}: records in {ledger.path}")
    with _stage(echo, "ingest (Spark)"):
        dataset = stages.ingest(config.ingest, config.kafka, run_date, ledger, Progress(emit=echo))
        _show(echo, text.describe_dataset(dataset))
    launch = config.torchrun
    with _stage(echo, f"train ({launch.nproc_per_node * launch.nnodes} DDP processes, torchrun)"):
        trained = stages.train(config.train_env, launch, dataset, ledger)
        _show(echo, text.describe_run(trained))
    with _stage(echo, "register (MLflow)"):
        registered = stages.register(config.registry, trained, ledger)
        _show(echo, text.describe_model(registered))
    with _stage(echo, "gate"):
        outcome = stages.gate(config.registry, registered, dataset, ledger)
        _show(echo, text.describe_gate(outcome))
    with _stage(echo, "monitor (live versions on the day whose labels matured)"):
        monitored = stages.monitor(config.monitoring, config.monitor_sources(), run_date, ledger)
        _show(echo, text.describe_monitor(monitored))
    night = stages.report(run_date, dataset, trained, registered, outcome, monitored, ledger)
    echo(text.decision_line(outcome))
    return night


def run_stage(config: CycleConfig, run_date: date, stage: str, echo: Echo = print) -> Record:
    """One stage of the night alone, its input read from the night's ledger (NightlyStageMissing
    when the previous stage has not finished for ``run_date``)."""
    from pipeline.ingest.progress import Progress

    ledger = NightLedger.for_date(run_date)
    read = ledger.read
    if stage == "ingest":
        record = stages.ingest(config.ingest, config.kafka, run_date, ledger, Progress(emit=echo))
        lines = text.describe_dataset(record)
    elif stage == "train":
        record = stages.train(config.train_env, config.torchrun, read(PublishedDataset), ledger)
        lines = text.describe_run(record)
    elif stage == "register":
        record = stages.register(config.registry, read(TrainedRun), ledger)
        lines = text.describe_model(record)
    elif stage == "gate":
        record = stages.gate(config.registry, read(RegisteredModel),
                             read(PublishedDataset), ledger)
        lines = [*text.describe_gate(record), text.decision_line(record)]
    elif stage == "monitor":
        record = stages.monitor(config.monitoring, config.monitor_sources(), run_date, ledger)
        lines = text.describe_monitor(record)
    elif stage == "report":
        record = stages.report(run_date, read(PublishedDataset), read(TrainedRun),
                               read(RegisteredModel), read(GateOutcome), read(MonitorOutcome), ledger)
        lines = text.describe_night(record)
    else:
        raise ValueError(f"unknown stage {stage!r}: one of {', '.join(STAGES)}")
    _show(echo, lines)
    return record


def _show(echo: Echo, lines: list[str]) -> None:
    for line in lines:
        echo(f"   {line}")


@contextmanager
def _stage(echo: Echo, name: str) -> Iterator[None]:
    """``-- name`` before, its duration after (a failure propagates untouched: it names its stage)."""
    started = time.monotonic()
    echo(f"-- {name}")
    yield
    echo(f"   ({time.monotonic() - started:.1f}s)")
