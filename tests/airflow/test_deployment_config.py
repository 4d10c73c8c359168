"""What an operator deploying the DAGs sets, against what the code reads: the Spark connection the
README adds is the one every environment's nightly.toml names, and ``$FRAUD_CONF_DIR`` set to a
``conf/`` root (instead of one environment's directory) is refused with the directory to set."""

from __future__ import annotations

import re

import pytest

from pipeline.config import PROJECT_ROOT, ConfigError
from pipeline.nightly.config import load_nightly_config


def _readme_airflow_section() -> str:
    readme = (PROJECT_ROOT / "README.md").read_text()
    start = readme.index("**Airflow.**")
    return readme[start:readme.index("\n## ", start)]


def test_the_connection_the_readme_adds_is_the_one_every_environment_submits_through():
    added = re.findall(r"^airflow connections add (\S+)", _readme_airflow_section(), flags=re.M)
    assert len(added) == 2  # the cluster's and the one-host try-out's
    assert set(added) == {load_nightly_config(env).spark_submit.conn_id for env in ("dev", "prod")}


def test_a_conf_root_in_fraud_conf_dir_is_refused_with_the_directory_to_set(monkeypatch: pytest.MonkeyPatch):
    conf_root = PROJECT_ROOT / "conf"
    monkeypatch.setenv("FRAUD_CONF_DIR", str(conf_root))
    monkeypatch.setenv("FRAUD_ENV", "prod")
    with pytest.raises(ConfigError) as refused:
        load_nightly_config()
    assert str(refused.value) == (
        f"$FRAUD_CONF_DIR={conf_root} holds environments (dev, prod), not one environment's files: set "
        f"FRAUD_CONF_DIR={conf_root / 'prod'}, or unset it and set FRAUD_ENV=prod for the project's own conf/prod")


def test_one_environments_directory_in_fraud_conf_dir_is_read(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FRAUD_CONF_DIR", str(PROJECT_ROOT / "conf" / "prod"))
    assert load_nightly_config() == load_nightly_config("prod")
