"""The training run directory: one layout, written by training (rank 0 only) and read by the
registry, rollback, launch and the demo. Every path of it is a property of :class:`RunDir`; what
``summary.json`` holds is :class:`RunSummary`.

Layout::

    <run_dir>/                    default: <state_dir>/runs/<run_name>
      config.json                 the training config as run, plus world_size and backend
      dataset.json                the dataset manifest trained on, byte for byte (lineage)
      dataset_root.txt            absolute path of the dataset root it was read from
      metrics/steps.jsonl         one record per logged optimizer step
      metrics/epochs.jsonl        one record per validation
      checkpoints/step-NNNNNNNN/  complete checkpoints (names: checkpoint_layout.py, content: checkpoint.py)
      checkpoints/best/           the checkpoint with the best validation AP
      model/                      calibrated FraudModel (safetensors + JSON)
      validation_scores.parquet   calibrated validation scores (plots)
      summary.json                RunSummary, written last: its presence means "finished"

Guarantees: whole files are replaced atomically (:mod:`pipeline.atomic`); the JSONL files are
append-only, readers ignore a torn last line (killed writer) and a resume drops it. This module
imports no torch, so the registry's command line can name its errors without loading it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.atomic import atomic_path, write_json_atomic, write_text_atomic
from pipeline.config import ConfigError, from_dict
from pipeline.datasets.manifest import DatasetManifest
from pipeline.paths import state_dir
from pipeline.training.checkpoint_layout import BEST, is_checkpoint, step_checkpoints

RUNS_DIR = "runs"  # <state_dir>/runs/<run_name>: where run directories go by default
CONFIG_FILE = "config.json"
DATASET_FILE = "dataset.json"
DATASET_ROOT_FILE = "dataset_root.txt"
STEPS_FILE = "metrics/steps.jsonl"
EPOCHS_FILE = "metrics/epochs.jsonl"
CHECKPOINTS = "checkpoints"
MODEL_DIR = "model"
SCORES_FILE = "validation_scores.parquet"
SUMMARY_FILE = "summary.json"

COMPLETED = "completed"


class CheckpointError(RuntimeError):
    """A checkpoint is missing or unreadable, or a path does not name one."""


class RunSummaryError(ValueError):
    """summary.json is not a RunSummary (missing or unknown field, wrong type, not JSON)."""


def runs_root() -> Path:
    return state_dir() / RUNS_DIR


@dataclass(frozen=True)
class CompressionSummary:
    method: str
    density: float | None  # top-k methods only


@dataclass(frozen=True)
class BlendSummary:
    """What the blend step (pipeline/training/blend.py) decided, and the evidence it decided on.

    The fields after ``train_rows`` arrived with out-of-sample decisions; a summary written before
    them has ``rule`` None, and its two AP figures were judged in sample (the booster early-stopped
    and the stack fitted on the same validation rows)."""

    kept: bool  # the booster is part of the model
    trees: int
    gbm_weight: float  # the booster's weight in the calibrated logit (0 when not kept)
    validation_ap_network: float  # the network's AP on the decision rows (all of validation)
    validation_ap_blend: float  # the blend's out-of-fold AP on the same rows
    train_rows: int  # rows the booster trained on
    early_stopping_rows: int | None = None  # latest train rows whose log-loss stopped the booster (trained on only by a refit)
    stacking_folds: int | None = None  # time folds of validation the stacking weight was cross-fitted over
    decision_rows: int | None = None  # validation rows the two APs were measured on
    decision_positives: int | None = None  # frauds among them
    ap_gain: float | None = None  # validation_ap_blend - validation_ap_network (out of fold)
    ap_gain_lower: float | None = None  # the gain's bootstrap interval (NaN: too few frauds for one)
    ap_gain_upper: float | None = None
    ap_gain_confidence: float | None = None  # two-sided level of that interval
    bootstrap_resamples: int | None = None  # resamples of whole cards behind the interval
    bootstrap_cards: int | None = None  # distinct cards resampled
    rule: str | None = None  # the keep rule applied, in words (None: an in-sample decision of an older run)
    # The booster was trained again on every train row (the early-stopping rows too) for ``trees``
    # rounds, the count the early-stopping rows chose (None: a run from before this field; False: not)
    refit_all_train: bool | None = None


@dataclass(frozen=True)
class DatasetRef:
    name: str
    version: str
    content_hash: str


@dataclass(frozen=True)
class RunSummary:
    """summary.json. The fields without a default are required: every writer of the contract has
    them. The others arrived later, so run directories written before them stay readable."""

    status: str  # COMPLETED: the only status ever written
    run_name: str
    global_step: int
    epochs: int  # epochs started (a partly run last epoch counts)
    best_epoch: int
    best_metrics: dict[str, float]  # validation metrics of the best epoch (calibrated ones without validation)
    temperature: float
    bytes_sent_total: int  # rank 0's bytes handed to gradient collectives
    bytes_dense_total: int  # what fp32 all-reduce would have handed over
    compression: CompressionSummary
    world_size: int
    wall_s: float  # wall time of the attempt that finished the run
    peak_rss_mb: float
    stopped_early: bool
    started_at: float | None = None  # epoch seconds: start of that attempt
    finished_at: float | None = None  # epoch seconds: when the summary was written
    logit_shift: float | None = None
    calibrated_ece: float | None = None
    backend: str | None = None
    peak_rss_mb_per_rank: tuple[float, ...] | None = None
    train_cpu_s_per_rank: tuple[float, ...] | None = None
    train_samples: int | None = None
    train_samples_per_s: float | None = None
    skipped_steps: int | None = None
    checkpoint_dir: str | None = None
    model_dir: str | None = None
    dataset: DatasetRef | None = None
    validation_rows: int | None = None
    blend: BlendSummary | None = None  # None: [blend] gbm off
    # What chose best_epoch: "validation AP", or why the schedule's last epoch was exported instead.
    epoch_picked_by: str | None = None

    @property
    def completed(self) -> bool:
        return self.status == COMPLETED

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = SUMMARY_FILE) -> RunSummary:
        """Parse and type-check; raises RunSummaryError naming the missing, unknown or mistyped field."""
        try:
            return from_dict(cls, json.loads(text), source=source)
        except json.JSONDecodeError as exc:
            raise RunSummaryError(f"{source} is not valid JSON ({exc})") from exc
        except ConfigError as exc:
            raise RunSummaryError(f"{exc}: not a run summary of this pipeline version") from exc


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory, and the reads and writes of its files."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def named(cls, run_name: str) -> RunDir:
        """The default run directory of ``run_name`` (under the state directory)."""
        return cls(runs_root() / run_name)

    @classmethod
    def of_checkpoint(cls, checkpoint_dir: Path) -> RunDir | None:
        """The run a checkpoint belongs to, when it sits in ``<run_dir>/checkpoints/``."""
        checkpoint_dir = Path(checkpoint_dir)
        return cls(checkpoint_dir.parent.parent) if checkpoint_dir.parent.name == CHECKPOINTS else None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def dataset(self) -> Path:
        return self.path / DATASET_FILE

    @property
    def dataset_root_file(self) -> Path:
        return self.path / DATASET_ROOT_FILE

    @property
    def steps(self) -> Path:
        return self.path / STEPS_FILE

    @property
    def epochs(self) -> Path:
        return self.path / EPOCHS_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def best_checkpoint(self) -> Path:
        return self.checkpoints / BEST

    @property
    def model(self) -> Path:
        return self.path / MODEL_DIR

    @property
    def validation_scores(self) -> Path:
        return self.path / SCORES_FILE

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY_FILE

    def find_checkpoint(self) -> Path | None:
        """``best/``, else the latest step checkpoint, else None."""
        if is_checkpoint(self.best_checkpoint):
            return self.best_checkpoint
        steps = step_checkpoints(self.checkpoints)
        return steps[-1] if steps else None

    # ---- written by training (rank 0) --------------------------------------------------------

    def write_inputs(self, config: dict[str, Any], manifest_file: Path, dataset_root: Path) -> None:
        """config.json, dataset.json (a byte copy of ``manifest_file``) and dataset_root.txt."""
        write_json_atomic(self.config, config)
        with atomic_path(self.dataset) as tmp:
            shutil.copyfile(manifest_file, tmp)
        write_text_atomic(self.dataset_root_file, str(Path(dataset_root).resolve()) + "\n")

    def append_step(self, record: dict[str, Any]) -> None:
        _append_jsonl(self.steps, record)

    def append_epoch(self, record: dict[str, Any]) -> None:
        _append_jsonl(self.epochs, record)

    def truncate_metrics_after(self, step: int) -> None:
        """Drop step and epoch records after ``step`` (and a torn last line): a resumed run replays
        those steps and logs them again."""
        _truncate_jsonl(self.steps, step)
        _truncate_jsonl(self.epochs, step)

    def write_summary(self, summary: RunSummary) -> None:
        write_text_atomic(self.summary, summary.to_json())

    # ---- read by the registry, launch, the demo ---------------------------------------------

    def read_summary(self) -> RunSummary | None:
        """The summary, or None when the run has not finished; RunSummaryError when it is malformed."""
        if not self.summary.is_file():
            return None
        return RunSummary.from_json(self.summary.read_text(), source=str(self.summary))

    def read_config(self) -> dict[str, Any]:
        return json.loads(self.config.read_text())

    def read_dataset(self) -> DatasetManifest:
        return DatasetManifest.from_json(self.dataset.read_text())

    def read_dataset_root(self) -> Path | None:
        """Where the dataset was read from; None for runs that did not record it."""
        return Path(self.dataset_root_file.read_text().strip()) if self.dataset_root_file.is_file() else None

    def read_steps(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.steps)

    def read_epochs(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.epochs)


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL metrics file ([] when absent). A torn last line is what a writer killed
    mid-append leaves and is skipped; a bad line anywhere else is corruption and raises ValueError."""
    if not path.is_file():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path} line {i + 1} is not JSON ({exc}); the metrics file is corrupt") from exc
    return records


def _truncate_jsonl(path: Path, step: int) -> None:
    if path.is_file():
        kept = [r for r in _read_jsonl(path) if r["step"] <= step]
        write_text_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """summary.json as a plain dict (checked against RunSummary), or None when the run has not finished."""
    summary = RunDir(run_dir).read_summary()
    return summary.to_dict() if summary is not None else None
