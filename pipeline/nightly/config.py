"""The orchestration's config slice, ``conf/<env>/nightly.toml``: when the nightly DAG runs, how it
retries, how it submits the Spark ingest and how torchrun starts training.

Read at DAG parse time: this module imports nothing heavier than the config loader, and a config
that cannot be read is a DAG import error whose message says what to set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from pipeline.config import ENV_VAR_CONF_DIR, ENV_VAR_CONF_ENV, ConfigError, conf_dir, load_section
from pipeline.training.launch import Torchrun


@dataclass(frozen=True)
class ScheduleConfig:
    cron: str = "0 2 * * *"  # when a night starts, in ``timezone``; its logical date is the run date
    timezone: str = "UTC"
    start_date: str = "2026-01-01"  # first run date the scheduler may create (catchup is off)
    retries: int = 2  # per task; a stage re-run is idempotent, so a retry is always safe
    retry_delay_s: float = 300.0  # first retry; then doubling (exponential backoff) ...
    max_retry_delay_s: float = 3600.0  # ... up to this
    dagrun_timeout_s: float = 6 * 3600.0  # a night still running after this is failed (the next may start)

    def __post_init__(self) -> None:
        try:
            date.fromisoformat(self.start_date)
        except ValueError as exc:
            raise ConfigError(f"schedule.start_date must be YYYY-MM-DD, got {self.start_date!r}") from exc
        if self.retries < 0 or self.retry_delay_s <= 0 or self.max_retry_delay_s < self.retry_delay_s:
            raise ConfigError("schedule: retries >= 0 and 0 < retry_delay_s <= max_retry_delay_s")


@dataclass(frozen=True)
class SparkSubmitConfig:
    """How the DAGs spark-submit ``jobs/ingest.py``. The master (and deploy mode, YARN queue,
    Kubernetes namespace) are the Airflow connection's, as for every SparkSubmitOperator."""

    # Airflow connection of type spark, host = the master URL. One name in every environment (the
    # README's `airflow connections add` line works for dev and prod alike), and not Airflow's own
    # "spark_default", which `airflow connections create-default-connections` points at YARN.
    conn_id: str = "spark_fraud"
    conf: dict[str, str] = field(default_factory=dict)  # --conf key=value, e.g. spark.executor.memory
    name: str = "fraud-ingest"  # application name in the cluster's UI


@dataclass(frozen=True)
class NightlyConfig:
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    spark_submit: SparkSubmitConfig = field(default_factory=SparkSubmitConfig)
    train: Torchrun = field(default_factory=Torchrun)


def load_nightly_config(env: str | None = None, path: Path | None = None) -> NightlyConfig:
    """``<conf_dir(env)>/nightly.toml`` (or ``path``). Raises ConfigError; one whose
    ``$FRAUD_CONF_DIR`` names a ``conf/`` root (dev/, prod/ inside) says which directory to name."""
    if path is None and env is None:
        _refuse_conf_root()
    return load_section(NightlyConfig, "nightly", env, path)


def _refuse_conf_root() -> None:
    """$FRAUD_CONF_DIR is one environment's directory: every component reads <dir>/<name>.toml."""
    directory = conf_dir()
    if not os.environ.get(ENV_VAR_CONF_DIR) or (directory / "nightly.toml").is_file():
        return
    envs = sorted(p.parent.name for p in directory.glob("*/nightly.toml"))
    if envs:
        env = os.environ.get(ENV_VAR_CONF_ENV) if os.environ.get(ENV_VAR_CONF_ENV) in envs else envs[0]
        raise ConfigError(
            f"${ENV_VAR_CONF_DIR}={directory} holds environments ({', '.join(envs)}), not one environment's files: "
            f"set {ENV_VAR_CONF_DIR}={directory / env}, or unset it and set {ENV_VAR_CONF_ENV}={env} for the "
            f"project's own conf/{env}")
