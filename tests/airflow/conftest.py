"""An Airflow installation for the DAG tests: a temporary AIRFLOW_HOME, a SQLite metadata DB
migrated by ``airflow db migrate``, no examples, the project's airflow_dags/ as the DAGs folder.

Airflow itself only ever runs in subprocesses (:mod:`tests.airflow.dag_runner`): see there why.

Without Airflow or its Spark provider these tests are skipped on a laptop, but fail in CI (``$CI``
set, as CI services do): there a broken install must not pass as a green run with the DAGs untested.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import PROJECT_ROOT
from pipeline.nightly.config import load_nightly_config


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def require_installed(module: str, what: str) -> None:
    """Import ``module``; when it cannot be imported, skip these tests, or fail them in CI."""
    if not in_ci():
        pytest.importorskip(module, reason=f"{what}: `make setup-airflow` (make test does it)")
        return
    try:
        importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"{what} cannot be imported ({exc}) and $CI is set, so the DAG tests may not be skipped: "
                    "run `make setup-airflow` in the CI job before the tests", pytrace=False)


require_installed("airflow", "Airflow (the `airflow` extra)")
require_installed("airflow.providers.apache.spark", "the Spark provider (apache-airflow-providers-apache-spark)")

DAGS_FOLDER = PROJECT_ROOT / "airflow_dags"
# dev's [spark_submit].conn_id: the story adds it to the session's DB with the README's command
# (tests/airflow/nights.py), and the story's own nightly.toml names it.
SPARK_CONN_ID = load_nightly_config("dev").spark_submit.conn_id


def airflow_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an Airflow process of these tests (``extra`` wins)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "KAFKA_", "SPARK_MASTER", "MLFLOW_TRACKING_URI"))}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS_FOLDER),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # spark-submit, airflow
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        OMP_NUM_THREADS="1",
    )
    env.update(extra or {})
    return env


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated metadata DB, shared by the session's DAG tests (each test uses its own DAG runs)."""
    home = tmp_path_factory.mktemp("airflow-home")
    done = subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=airflow_env(home),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return home


RunAirflow = Callable[..., tuple[dict[str, Any], str]]


@pytest.fixture(scope="session")
def run_airflow(airflow_home: Path, tmp_path_factory: pytest.TempPathFactory) -> RunAirflow:
    """``run_airflow(*args, env={...})`` -> (the runner's JSON result, its stdout + stderr: the task logs)."""
    out_dir = tmp_path_factory.mktemp("airflow-out")
    calls = iter(range(1_000_000))

    def run(*args: str, env: dict[str, str] | None = None, timeout_s: float = 900) -> tuple[dict[str, Any], str]:
        out = out_dir / f"{next(calls)}.json"
        done = subprocess.run([sys.executable, "-m", "tests.airflow.dag_runner", *args, "--out", str(out)],
                              env=airflow_env(airflow_home, env), cwd=PROJECT_ROOT, capture_output=True, text=True,
                              timeout=timeout_s)
        log = done.stdout + done.stderr
        assert done.returncode == 0 and out.is_file(), log[-5000:]
        return json.loads(out.read_text()), log

    return run


@pytest.fixture(scope="session")
def story(run_airflow, airflow_home, kafka_broker, tmp_path_factory: pytest.TempPathFactory):
    """The DAG runs of tests/airflow/nights.py, played once for every DAG test that reads them."""
    from tests.airflow.nights import play_story

    return play_story(run_airflow, airflow_home, kafka_broker, tmp_path_factory.mktemp("nightly-dag"))
