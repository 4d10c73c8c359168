"""The registry's config slice (``conf/<env>/registry.toml``) and where its MLflow store lives.

``tracking_uri`` is a connection setting: ``$MLFLOW_TRACKING_URI`` wins over the file. Empty means the
embedded store: a SQLite database and a local artifact directory under ``state_dir()/mlflow``. In
production it names a tracking server (PostgreSQL-backed, object-store artifacts); the server then
owns the artifact location and ``artifact_root`` is unused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from pipeline.config import ConfigError, env_override, load_section
from pipeline.paths import resolve_state_path, state_dir

EMBEDDED_DB = "mlflow/mlflow.db"  # relative to state_dir()

GuardrailMode = Literal["block", "warn"]


@dataclass(frozen=True)
class Guardrail:
    """A threshold and what a failure does: ``block`` rejects the challenger, ``warn`` only reports."""

    value: float
    mode: GuardrailMode = "block"


@dataclass(frozen=True)
class IntervalConfig:
    """How the paired challenger-minus-champion intervals are computed (same rows, both models)."""

    confidence: float = 0.95  # two-sided level of every interval shown and decided on
    bootstrap_resamples: int = 1000  # average precision and the budget metrics: resamples of the holdout's cards
    seed: int = 0  # fixed, so re-running a gate on the same rows gives the same intervals

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"gate.intervals.confidence must be in [0.5, 1), got {self.confidence}")
        if self.bootstrap_resamples < 100:
            raise ConfigError(f"gate.intervals.bootstrap_resamples must be >= 100, got {self.bootstrap_resamples}")


@dataclass(frozen=True)
class GateConfig:
    """Thresholds of the promotion gate (see :func:`pipeline.registry.gate.should_promote`).

    Comparisons with the champion are non-inferiority tests on paired intervals: a margin ``m``
    rejects the challenger only when the whole interval of (challenger - champion) lies below ``-m``,
    i.e. when it is worse by more than ``m`` beyond reasonable doubt. Differences inside the noise of
    the holdout never block a fresher model.
    """

    # Largest AUC-ROC loss vs the champion that still counts as "as good" (AUC units, >= 0).
    auc_margin: float = 0.002
    # With no champion yet, the first model must reach this AUC-ROC on the holdout.
    first_model_auc_floor: float = 0.75
    # Largest average-precision loss vs the champion that still counts as "as good" (AP units).
    ap_tolerance: Guardrail = field(default_factory=lambda: Guardrail(0.02))
    # Largest expected calibration error: the scoring service thresholds calibrated probabilities.
    ece_limit: Guardrail = field(default_factory=lambda: Guardrail(0.05))
    # Largest PSI of challenger scores vs champion scores on the holdout (0.25 = "major shift").
    psi_limit: Guardrail = field(default_factory=lambda: Guardrail(0.25))
    # Fewer holdout frauds than this and AUC/AP differences are noise: "insufficient evidence".
    min_holdout_frauds: Guardrail = field(default_factory=lambda: Guardrail(30))
    # Largest share of holdout rows the challenger may score as NaN (0: none at all).
    max_nan_share: Guardrail = field(default_factory=lambda: Guardrail(0.0))
    # Largest loss of recall at the review budget vs the champion that still counts as "as good"
    # (recall units): both models flag the same top share of the holdout, the challenger's budget.
    # Warn unless a config says block: AUC is what the gate always required; rejecting on the budget
    # is a deployment's choice (conf/prod blocks).
    budget_recall_margin: Guardrail = field(default_factory=lambda: Guardrail(0.02, "warn"))
    # The budget both models are compared at when the challenger carries no operating points
    # (registered before they existed, or explicit thresholds): keep it equal to train.toml's
    # [decisions].review_rate, the budget new versions are chosen from.
    review_rate: float = 0.005
    intervals: IntervalConfig = field(default_factory=IntervalConfig)

    def __post_init__(self) -> None:
        if self.auc_margin < 0 or self.ap_tolerance.value < 0 or self.budget_recall_margin.value < 0:
            raise ConfigError("gate.auc_margin, gate.ap_tolerance and gate.budget_recall_margin are margins: "
                              "they must be >= 0")
        if not 0.0 < self.review_rate < 1.0:
            raise ConfigError(f"gate.review_rate is a share of payments: it must be in (0, 1), got {self.review_rate}")


@dataclass(frozen=True)
class RegistryConfig:
    tracking_uri: str = env_override("MLFLOW_TRACKING_URI", "")  # "" = embedded SQLite store
    artifact_root: str = "mlflow/artifacts"  # embedded store only; relative paths are under state_dir()
    experiment_name: str = "fraud-training"
    model_name: str = "fraud-detector"
    holdout_split: str = "test"  # the manifest split the gate scores on
    connect_timeout_s: int = 5  # per HTTP request while checking the server is reachable
    lock_timeout_s: float = 600.0  # how long a gate/rollback waits for another one to finish
    # A lock holder renews its lease every quarter of this; one silent for this long is presumed dead.
    lock_lease_s: float = 60.0
    gate: GateConfig = field(default_factory=GateConfig)


def load_registry_config(env: str | None = None, path: Path | None = None) -> RegistryConfig:
    return load_section(RegistryConfig, "registry", env, path)


def resolved_tracking_uri(config: RegistryConfig) -> str:
    """The URI MLflow is pointed at: the configured one, or the embedded SQLite store."""
    if config.tracking_uri:
        return config.tracking_uri
    db = state_dir() / EMBEDDED_DB
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


def artifact_location(config: RegistryConfig) -> str | None:
    """Artifact location for a new experiment: local dir for a local store, server default otherwise."""
    if is_remote(config):
        return None
    return resolve_state_path(config.artifact_root).resolve().as_uri()


def is_remote(config: RegistryConfig) -> bool:
    return urlparse(resolved_tracking_uri(config)).scheme in ("http", "https", "databricks")


def local_store_dir(config: RegistryConfig) -> Path:
    """Directory of a local store (SQLite file's directory, or a file store); state dir for a server."""
    uri = resolved_tracking_uri(config)
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        # sqlite:////abs/path.db -> path "//abs/path.db"; sqlite:///rel.db -> "/rel.db" (relative to cwd)
        raw = uri[len("sqlite:///"):]
        return Path(raw).resolve().parent
    if parsed.scheme in ("", "file"):
        return Path(parsed.path or uri).resolve()
    return state_dir() / "mlflow"
