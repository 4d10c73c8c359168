"""The registry config slice: checked-in files load, env override, validation, store locations."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError
from pipeline.registry.audit import resolve_actor
from pipeline.registry.config import (
    RegistryConfig,
    artifact_location,
    is_remote,
    load_registry_config,
    local_store_dir,
    resolved_tracking_uri,
)


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_checked_in_configs_load(env, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = load_registry_config(env)
    assert config.model_name == "fraud-detector"
    assert config.gate.auc_margin > 0 and config.gate.intervals.confidence == 0.95
    assert config.gate.min_holdout_frauds.mode == "block"


def test_the_budget_recall_guardrail_warns_in_dev_and_blocks_in_prod(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    dev, prod = (load_registry_config(env).gate for env in ("dev", "prod"))
    assert (dev.budget_recall_margin.mode, prod.budget_recall_margin.mode) == ("warn", "block")
    assert dev.budget_recall_margin.value > 0 and prod.budget_recall_margin.value > 0
    assert dev.review_rate == prod.review_rate == 0.005


def test_dev_uses_the_embedded_sqlite_store_under_the_state_dir(state_dir, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = load_registry_config("dev")
    assert resolved_tracking_uri(config) == f"sqlite:///{state_dir / 'mlflow' / 'mlflow.db'}"
    assert artifact_location(config) == (state_dir / "mlflow" / "artifacts").as_uri()
    assert not is_remote(config)


def test_mlflow_tracking_uri_overrides_the_file(state_dir, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.example:5000")
    config = load_registry_config("dev")
    assert resolved_tracking_uri(config) == "https://mlflow.example:5000"
    assert is_remote(config) and artifact_location(config) is None
    assert local_store_dir(config) == state_dir / "mlflow"


def test_explicit_sqlite_uri_gives_its_directory_as_the_local_store(tmp_path):
    config = RegistryConfig(tracking_uri=f"sqlite:///{tmp_path}/elsewhere/store.db")
    assert local_store_dir(config) == tmp_path / "elsewhere"


def test_unknown_gate_key_and_bad_mode_are_named(tmp_path):
    bad_key = tmp_path / "registry.toml"
    bad_key.write_text('[gate]\nece_limt = { value = 0.1, mode = "block" }\n')
    with pytest.raises(ConfigError, match="unknown key 'gate.ece_limt'"):
        load_registry_config(path=bad_key)
    bad_mode = tmp_path / "mode.toml"
    bad_mode.write_text('[gate]\nece_limit = { value = 0.1, mode = "ignore" }\n')
    with pytest.raises(ConfigError, match=r"gate.ece_limit.mode must be one of \['block', 'warn'\]"):
        load_registry_config(path=bad_mode)


def test_actor_is_explicit_or_the_login_name(monkeypatch):
    assert resolve_actor("airflow") == "airflow"
    monkeypatch.setenv("LOGNAME", "risk-oncall")
    assert resolve_actor(None) == "risk-oncall"

