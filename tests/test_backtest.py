"""``fraudctl backtest``: the layout arithmetic, and one backtest end to end on a small simulated
history (simulator -> real broker -> ingest job -> backtest dataset -> torchrun -> protocol figures)."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import date, timedelta
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from pipeline.backtest import REPORT_FILE, BacktestSpec, backtest_ingest_config, score_frame
from pipeline.cli.main import cli
from pipeline.contract import Kind
from pipeline.datasets.manifest import load_manifest
from pipeline.evaluation.holdout import load_holdout
from pipeline.evaluation.protocol import BacktestDays
from pipeline.ingest.config import load_ingest_config
from pipeline.ingest.job import run_raw_ingest
from pipeline.ingest.progress import quiet
from pipeline.kafka.producer import publish_records
from pipeline.simulation import load_simulation_config
from pipeline.simulation.windows import Window, labels_published_on, simulate_window
from pipeline.training.config import derive_train_config, write_train_toml
from pipeline.training.run_dir import RunDir
from tests.card_precision import card_precision_at_k
from tests.ingest.process_helpers import write_conf_dir

START = date(2026, 1, 1)
DAYS = BacktestDays(train=8, validation=3, gap=4, test=4)
TRAIN_END = START + timedelta(days=DAYS.train + DAYS.validation - 1)  # 2026-01-11


def test_the_layout_ends_validation_on_train_end_then_the_gap_then_the_test_days():
    layout = BacktestSpec(date(2026, 1, 19), BacktestDays(train=14, validation=5, gap=7, test=7)).layout
    assert {name: (w.start, w.end) for name, w in layout.windows().items()} == {
        "train": ("2026-01-01", "2026-01-14"),
        "validation": ("2026-01-15", "2026-01-19"),
        "gap": ("2026-01-20", "2026-01-26"),
        "test": ("2026-01-27", "2026-02-02"),
    }
    assert layout.train_label_cutoff == date(2026, 1, 26)  # labels as known G days after --train-end
    assert layout.test_label_cutoff == date(2026, 2, 9)  # test labels fully matured


def test_the_dataset_config_takes_the_layout_and_the_gap_as_label_maturity(tmp_path):
    config = backtest_ingest_config(load_ingest_config("dev"), DAYS, tmp_path / "d")
    d = config.dataset
    assert (d.train_days, d.validation_days, d.gap_days, d.test_days, d.label_maturity_days) == (8, 3, 4, 4, 4)
    assert d.root == str(tmp_path / "d")


@pytest.fixture
def simulated_history(kafka_config, state_dir, tmp_path, monkeypatch) -> tuple[Path, pd.DataFrame]:
    """A small portfolio over the whole layout plus its maturity, landed in the raw store by the ingest job;
    a config directory whose training is short. Returns (conf dir, the simulator's truth)."""
    conf = write_conf_dir(tmp_path / "conf", kafka_config,
                          {"min_rows": "{ train = 500, validation = 100, test = 100 }", "shuffle_partitions": "2"})
    train = derive_train_config("dev", {"data": {"global_batch_size": 256},
                                        "loop": {"epochs": 3, "log_every": 20}, "checkpoint": {"every_steps": 1000}})
    write_train_toml(train, conf / "train.toml")
    monkeypatch.setenv("FRAUD_CONF_DIR", str(conf))
    base = dataclasses.replace(load_simulation_config("dev"), fraud_rate=0.02)
    window = Window(0, START, DAYS.train + DAYS.validation + DAYS.gap + DAYS.test + DAYS.gap)
    sim = simulate_window(window, base, num_cards=400, num_merchants=100)
    labels = labels_published_on(window, None, [sim])
    assert publish_records(kafka_config, kafka_config.transactions_topic, Kind.TRANSACTION,
                           sim.transaction_records()).ok
    assert publish_records(kafka_config, kafka_config.labels_topic, Kind.LABEL, labels.to_dict("records")).ok
    run_raw_ingest(load_ingest_config(), kafka_config, progress=quiet())
    return conf, sim.truth


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.broker
def test_backtest_builds_its_own_dataset_trains_and_scores_the_test_days_with_the_protocol(simulated_history,
                                                                                        state_dir, tmp_path):
    # One raw store for both cases (its ingest is the slow part). First a layout past its history:
    late = TRAIN_END + timedelta(days=10)
    refused = CliRunner().invoke(cli, ["backtest", "--train-end", late.isoformat(), "--train-days", "8",
                                       "--gap-days", "4", "--test-days", "4", "--out", str(tmp_path / "late")])
    assert refused.exit_code == 1, refused.output
    assert "PlanError" in refused.output and "ingest up to" in refused.output
    assert not (tmp_path / "late" / "run").exists()

    out = tmp_path / "bt"
    args = ["backtest", "--train-end", TRAIN_END.isoformat(), "--train-days", "8", "--validation-days", "3",
            "--gap-days", "4", "--test-days", "4", "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / REPORT_FILE).read_text())
    assert report["layout"] == {"train": ["2026-01-01", "2026-01-08"], "validation": ["2026-01-09", "2026-01-11"],
                                "gap": ["2026-01-12", "2026-01-15"], "test": ["2026-01-16", "2026-01-19"]}
    manifest = load_manifest(out / "dataset", report["dataset"]["version"])
    assert manifest.splits["test"].start == "2026-01-16" and manifest.splits["train"].end == "2026-01-08"
    # The holdout is the test days only, with known-compromised cards' rows removed, and it was scored.
    holdout = report["holdout"]
    assert (holdout["start"], holdout["end"]) == ("2026-01-16", "2026-01-19")
    metrics = report["metrics"]
    assert metrics["n"] == holdout["n"] > 0 and metrics["n_fraud"] > 0
    assert metrics["auc_roc"] > 0.6  # a trained model, not a constant
    # The rows removed, printed and in the metrics, are the holdout's count (the protocol's own pass over
    # the already filtered rows finds none), and this history has cards compromised in training that
    # pay again on the test days.
    printed = re.search(r"^\s*n_known_removed\s+(\d+)\s*$", result.output, re.MULTILINE)
    assert printed is not None, result.output
    assert int(printed[1]) == metrics["n_known_removed"] == holdout["n_known_removed"] > 0
    # Card precision@100 of the trained model on the holdout's rows, from the definition.
    rows = load_holdout(out / "dataset", "test", report["dataset"]["version"]).frame
    precision = card_precision_at_k(rows.assign(score=score_frame(RunDir(out / "run"), rows)))
    assert precision > 0 and metrics["card_precision_at_100"] == pytest.approx(precision)
    assert "card_precision_at_100" in result.output and str(out / REPORT_FILE) in result.output
    # The production dataset (ingest.toml's root) was not touched: no LATEST there.
    assert not (state_dir / "datasets" / "fraud-dev" / "LATEST").exists()
    # A re-run reuses the dataset and the finished run: same figures.
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0, again.output
    assert json.loads((out / REPORT_FILE).read_text())["metrics"]["auc_roc"] == metrics["auc_roc"]
