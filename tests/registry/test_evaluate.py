"""``evaluate_window`` and the registry CLI commands end to end (click runner, real store)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.datasets.reader import read_window
from pipeline.metrics import classification_report
from pipeline.registry.errors import DatasetError
from pipeline.registry.evaluate import REPORT_KEYS, evaluate_window
from pipeline.registry.tracking import register_run
from tests.registry import factory


@pytest.fixture
def version(world, config):
    return register_run(world.run_dir(f"{config.model_name}-model", world.good), config)


def test_evaluate_reports_the_standard_metrics_on_the_window(world, config, version, tmp_path):
    out = tmp_path / "scores.parquet"
    report = evaluate_window(f"models:/{config.model_name}/{version}", world.root, "2024-03-06", "2024-03-08", out)
    window = read_window(world.root, world.manifest, "2024-03-06", "2024-03-08")
    # The protocol: cards with a fraud before the window are known compromised and left out.
    before = read_window(world.root, world.manifest, "2024-03-01", "2024-03-05")
    known = set(before.loc[before["label"] == 1, "card_id"])
    frame = window[~window["card_id"].isin(known)].reset_index(drop=True)
    assert 0 < len(frame) < len(window)
    expected = classification_report(frame["label"], factory.score(world.good, frame))
    assert set(REPORT_KEYS) <= set(report)
    assert (report["n"], report["n_fraud"], report["n_known_removed"]) == (
        len(frame), int(frame["label"].sum()), len(window) - len(frame))
    assert report["auc_roc"] == pytest.approx(expected["auc_roc"])
    assert report["ece"] == pytest.approx(expected["ece"])
    assert 0.0 <= report["card_precision_at_100"] <= 1.0
    scores = pd.read_parquet(out)
    assert list(scores.columns) == ["transaction_id", "card_id", "event_time", "score", "label"]
    assert scores["transaction_id"].tolist() == frame["transaction_id"].tolist()
    np.testing.assert_allclose(scores["score"], factory.score(world.good, frame), rtol=1e-6)


def test_evaluate_window_outside_the_dataset_is_a_clear_error(world, config, version):
    with pytest.raises(DatasetError, match="no rows in 2025-01-01..2025-01-02"):
        evaluate_window(f"models:/{config.model_name}/{version}", world.root, "2025-01-01", "2025-01-02")


def invoke(world, args):
    result = CliRunner().invoke(cli, args, env={"FRAUD_STATE_DIR": str(world.state)}, catch_exceptions=False)
    return result.exit_code, result.output


def test_cli_register_promote_history_evaluate(world, tmp_path):
    """The commands an operator runs, with conf/dev/registry.toml (model ``fraud-detector``)."""
    code, out = invoke(world, ["promote"])
    assert code == 1 and "NoChallenger" in out
    run_dir = world.run_dir("cli-good", world.good)
    code, out = invoke(world, ["register", "--run-dir", str(run_dir)])
    assert code == 0 and "registered fraud-detector v1 as challenger" in out
    code, out = invoke(world, ["promote", "--actor", "ops"])
    assert code == 0 and "PROMOTED: v1 is champion" in out and "auc_roc" in out
    invoke(world, ["register", "--run-dir", str(world.run_dir("cli-worse", factory.inverted(world.good)))])
    code, out = invoke(world, ["promote", "--json"])
    assert code == 3 and json.loads(out)["outcome"] == "rejected"
    code, out = invoke(world, ["history"])
    assert code == 0 and "champion=v1" in out and "challenger=v2" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("time"))
    assert [line.split()[2] for line in lines[header + 1:]] == ["promote", "reject"]
    assert lines[1].startswith("  v1: review >= ") and lines[2].startswith("  v2: review >= ")  # their thresholds
    code, out = invoke(world, ["evaluate", "--model-uri", "models:/fraud-detector@champion",
                               "--start", "2024-03-07", "--end", "2024-03-08",
                               "--scores-out", str(tmp_path / "s.parquet")])
    report = json.loads(out)  # 800 rows in the window, less those of cards known compromised
    assert code == 0 and report["n"] + report["n_known_removed"] == 800 and (tmp_path / "s.parquet").is_file()
    code, out = invoke(world, ["rollback"])
    assert code == 1 and "no previous champion" in out
    code, out = invoke(world, ["rollback", "--to-version", "2", "--reason", "drill", "--actor", "ops"])
    assert code == 0 and "champion v1 -> v2" in out
    code, out = invoke(world, ["evaluate", "--model-uri", "models:/fraud-detector@champion",
                               "--start", "2024-13-01", "--end", "2024-03-08"])
    assert code == 2 and "not a date" in out
