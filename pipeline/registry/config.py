"""The registry's config slice (``conf/<env>/registry.toml``) and where its MLflow store lives.

``tracking_uri`` is a connection setting: ``$MLFLOW_TRACKING_URI`` wins over the file. Empty means the
embedded store: a SQLite database and a local artifact directory under ``state_dir()/mlflow``. In
production it names a tracking server (PostgreSQL-backed, object-store artifacts); the server then
owns the artifact location and ``artifact_root`` is unused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from pipeline.config import env_override, load_section
from pipeline.evaluation.config import GateConfig
from pipeline.paths import resolve_state_path, state_dir

EMBEDDED_DB = "mlflow/mlflow.db"  # relative to state_dir()


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
