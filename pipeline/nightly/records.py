"""What each stage of a night hands to the next, and where a night keeps them.

A stage's output is a small typed record: the ids the next stage needs (dataset version, run
directory, model version) plus the figures the report shows. In Airflow the records travel as
XCom values (:meth:`to_dict`); on disk they are the night's ledger, ``<state>/nightly/<run date>/``,
one JSON file per stage, each written atomically once its stage has finished (a stage run by hand
reads its input there). A record only ever names something already published: a dataset whose
manifest is written, a run whose summary is written, a registered version, a recorded decision.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, TypeVar

from pipeline.atomic import write_json_atomic
from pipeline.config import ConfigError, from_dict
from pipeline.contract import RejectReason
from pipeline.paths import state_dir

NIGHTLY_DIR = "nightly"  # <state>/nightly/<run date>/


class NightlyStageMissing(RuntimeError):
    """A stage's input record is not in the ledger: its previous stage has not finished for this date."""


@dataclass(frozen=True)
class Record:
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (tuples as lists): what XCom and the ledger store, read by :meth:`from_dict`."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls: type[R], value: dict[str, Any], source: str = "<xcom>") -> R:
        try:
            return from_dict(cls, value, source=source)
        except ConfigError as exc:
            raise ValueError(f"not a {cls.__name__} record: {exc}") from exc


R = TypeVar("R", bound=Record)


CONFLICTING = RejectReason.CONFLICTING_DUPLICATE.value


@dataclass(frozen=True)
class Landed:
    """One topic's accounting from the night's Kafka read."""

    kind: str  # transaction | label
    read: int
    valid: int
    quarantined: int  # conflicting duplicates included
    duplicates: int
    conflicting_duplicates: int = 0  # among ``quarantined``: another version of a stored or earlier event


@dataclass(frozen=True)
class PublishedDataset(Record):
    """ingest's output: the dataset version published for the run date."""

    name: str
    root: str
    version: str
    label_cutoff: str
    rows: int
    frauds: int
    reused: bool  # this exact version was already published (a re-run)
    landed: tuple[Landed, ...] = ()
    ingest_run_id: str = ""
    log_file: str = ""

    @classmethod
    def from_ingest_report(cls, report: dict[str, Any]) -> PublishedDataset:
        """From :meth:`pipeline.ingest.job.IngestReport.to_dict` (``jobs/ingest.py --report-json``)."""
        dataset = report.get("dataset")
        if not dataset:
            raise ValueError(f"ingest run {report.get('run_id')} published no dataset")
        landed = tuple(Landed(a["kind"], a["read"], a["valid"], sum(a["quarantined"].values()), a["duplicates"],
                              a["quarantined"].get(CONFLICTING, 0))
                       for a in report.get("accounting", ()))
        return cls(name=dataset["name"], root=dataset["root"], version=dataset["version"],
                   label_cutoff=dataset["label_cutoff"], rows=dataset["rows"], frauds=dataset["frauds"],
                   reused=dataset["reused"], landed=landed, ingest_run_id=report["run_id"],
                   log_file=report.get("log_file") or "")


@dataclass(frozen=True)
class TrainedRun(Record):
    """train's output: a finished run directory (summary.json written) and what it trained on."""

    run_dir: str
    dataset_version: str
    best_epoch: int
    best_metrics: dict[str, float]
    world_size: int
    compression: str
    bytes_sent_total: int
    bytes_dense_total: int
    wall_s: float
    reused: bool  # the run had already finished: nothing was launched


@dataclass(frozen=True)
class RegisteredModel(Record):
    """register's output: the registered version (alias ``challenger``) made from the run."""

    model_name: str
    version: int
    run_dir: str


@dataclass(frozen=True)
class GateOutcome(Record):
    """gate's output. A rejection is a decision, not a failure: the night succeeded."""

    outcome: str  # promoted | rejected | already-champion (pipeline.evaluation.report)
    promoted: bool
    challenger_version: int
    compared_with: int | None  # the champion it was gated against (None: the first model)
    champion_version: int | None  # the champion after the gate
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]
    challenger_metrics: dict[str, float | None]
    champion_metrics: dict[str, float | None] | None
    replayed: bool  # the recorded decision of an identical earlier gate
    text: str  # the gate report as printed by `fraudctl promote`


@dataclass(frozen=True)
class MonitoredVersion:
    """One model version's figures on the monitored day (the full set is in the report file)."""

    version: int
    state: str  # ok | degraded | insufficient_evidence | unjudged
    rows: int
    frauds: int
    recall: float | None  # at the operating points (None: undefined, no frauds)
    expected_recall: float | None
    review_rate: float | None
    review_budget: float | None


@dataclass(frozen=True)
class MonitorOutcome(Record):
    """monitor's output: how the live versions did on the day whose labels matured by the run date.
    A degraded model is a finding, not a failure: the night succeeded (``exit_code`` is what
    ``fraudctl monitor`` would exit with)."""

    monitored_date: str
    state: str  # the day's: degraded | ok | unjudged | insufficient_evidence | nothing_to_monitor
    exit_code: int
    versions: tuple[MonitoredVersion, ...]
    rollbacks: tuple[str, ...]  # what auto_rollback did (empty when off or not needed)
    report: str  # <state>/monitoring/<date>/report.json
    text: str  # the report as `fraudctl monitor` prints it


@dataclass(frozen=True)
class NightReport(Record):
    """report's output: the night in one record."""

    run_date: str
    dataset: PublishedDataset
    run: TrainedRun
    model: RegisteredModel
    gate: GateOutcome
    monitor: MonitorOutcome | None = None  # None in reports written before the monitor stage existed


# The ledger file of each record: <stage>.json.
STAGE_OF: dict[type[Record], str] = {
    PublishedDataset: "ingest", TrainedRun: "train", RegisteredModel: "register", GateOutcome: "gate",
    MonitorOutcome: "monitor", NightReport: "report",
}
STAGES = tuple(STAGE_OF.values())  # in the order a night runs them


@dataclass(frozen=True)
class NightLedger:
    """``<state>/nightly/<run date>/``: the records of one night, and the files its stages write."""

    path: Path

    @classmethod
    def for_date(cls, run_date: date) -> NightLedger:
        return cls(state_dir() / NIGHTLY_DIR / run_date.isoformat())

    @property
    def ingest_report(self) -> Path:
        """Where ``jobs/ingest.py --report-json`` writes its run report (the DAG's ingest task)."""
        return self.path / "ingest-report.json"

    @property
    def train_config(self) -> Path:
        """The training config the night's run reads: the environment's, pinned to the dataset version."""
        return self.path / "train.toml"

    def record_path(self, kind: type[Record]) -> Path:
        return self.path / f"{STAGE_OF[kind]}.json"

    def write(self, record: Record) -> None:
        write_json_atomic(self.record_path(type(record)), record.to_dict())

    def read(self, kind: type[R]) -> R:
        """The night's record of that kind; NightlyStageMissing when its stage has not finished."""
        path = self.record_path(kind)
        if not path.is_file():
            stage = STAGE_OF[kind]
            raise NightlyStageMissing(f"no {stage} record for {self.path.name} ({path} is missing): "
                                      f"run `fraudctl nightly --run-date {self.path.name} --stage {stage}` first")
        return kind.from_dict(json.loads(path.read_text()), source=str(path))
