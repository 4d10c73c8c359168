"""Registry commands against a real SQLite MLflow store: a model name the store does not know is an
error (exit 1, naming it and the models that exist), never an empty history or a missing alias."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.config import PROJECT_ROOT
from pipeline.registry.config import RegistryConfig
from pipeline.registry.store import connect

REGISTERED = ("fraud-detector", "fraud-detector-shadow")
TYPO = "fraud-detectr"


@pytest.fixture
def store(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The embedded store of a fresh state dir, holding the registered models ``REGISTERED``."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = connect(RegistryConfig())
    for name in REGISTERED:
        client.create_registered_model(name)
    return state_dir


def conf_with_model_name(conf_dir: Path, model_name: str) -> Path:
    """conf/dev/registry.toml with another model_name: what a typo in a deployment's config looks like."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    text = (PROJECT_ROOT / "conf" / "dev" / "registry.toml").read_text()
    (conf_dir / "registry.toml").write_text(text.replace('model_name = "fraud-detector"', f'model_name = "{model_name}"'))
    return conf_dir


def fraudctl(store: Path, conf: Path, *args: str) -> tuple[int, str]:
    env = {"FRAUD_STATE_DIR": str(store), "FRAUD_CONF_DIR": str(conf), "MLFLOW_TRACKING_URI": None}
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize("args", [("history",), ("history", "--json"), ("promote",), ("rollback",),
                                  ("rollback", "--to-version", "1")], ids=" ".join)
def test_an_unknown_configured_model_is_an_error_naming_the_known_ones(store: Path, tmp_path: Path,
                                                                      args: tuple[str, ...]) -> None:
    code, out = fraudctl(store, conf_with_model_name(tmp_path / "conf", TYPO), *args)
    assert code == 1, out
    assert f"no registered model '{TYPO}'" in out
    assert "registered models: fraud-detector, fraud-detector-shadow" in out


def test_evaluate_of_an_unknown_model_uri_is_an_error_naming_the_known_ones(store: Path, tmp_path: Path) -> None:
    code, out = fraudctl(store, conf_with_model_name(tmp_path / "conf", "fraud-detector"), "evaluate",
                         "--model-uri", f"models:/{TYPO}@champion", "--start", "2026-01-01", "--end", "2026-01-02")
    assert code == 1, out
    assert f"no registered model '{TYPO}'" in out and "fraud-detector-shadow" in out


def test_history_of_a_known_model_with_no_records_is_a_table(store: Path, tmp_path: Path) -> None:
    code, out = fraudctl(store, conf_with_model_name(tmp_path / "conf", "fraud-detector-shadow"), "history")
    assert code == 0, out
    assert out.splitlines()[0] == "fraud-detector-shadow: champion=-  previous-champion=-  challenger=-"
