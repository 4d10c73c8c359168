"""``evaluate_window`` and the registry CLI commands end to end (click runner, real store)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.datasets.manifest import DateWindow, content_hash, file_sha256, publish_manifest
from pipeline.datasets.reader import read_shards, read_window
from pipeline.metrics import classification_report
from pipeline.registry.errors import DatasetError
from pipeline.registry.evaluate import REPORT_KEYS, evaluate_window
from pipeline.registry.tracking import register_run
from tests.card_precision import card_precision_at_k
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
    scores = pd.read_parquet(out)
    assert list(scores.columns) == ["transaction_id", "card_id", "event_time", "score", "label"]
    assert scores["transaction_id"].tolist() == frame["transaction_id"].tolist()
    np.testing.assert_allclose(scores["score"], factory.score(world.good, frame), rtol=1e-6)
    # The model's own scores (checked just above) on the rows, cards, days and labels built here.
    precision = card_precision_at_k(frame.assign(score=scores["score"].to_numpy()))
    assert precision > 0 and report["card_precision_at_100"] == pytest.approx(precision)


# A world with fraud reports and a gap: train 03-01..03-04, validation 03-05, a gap day 03-06 in no split
# (its frauds count only once reported), test 03-07..03-08.
GAP_SPLITS = {"train": DateWindow("2024-03-01", "2024-03-04"), "validation": DateWindow("2024-03-05", "2024-03-05"),
              "test": DateWindow("2024-03-07", "2024-03-08")}
GAP_DAY = "2024-03-06"
REPORT_DELAY = pd.Timedelta(hours=6)  # each fraud is reported 6 h after its payment
GAP_CARDS_PAYING_AGAIN = 3  # cards with a fraud on the gap day, reported that day, that pay on 03-07


def _write_shard(path: Path, frame: pd.DataFrame) -> None:
    times = {"event_time", "reported_at"}
    columns = {c: pa.array(frame[c].dt.tz_convert(None).to_numpy(), type=pa.timestamp("us", tz="UTC"),
                           from_pandas=True) if c in times else pa.array(frame[c].to_numpy()) for c in frame.columns}
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


@pytest.fixture(scope="module")
def gap_world(world, tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    """The registry world's rows with a ``reported_at`` per fraud, republished under the gap layout, plus
    payments on the first test day by cards whose gap-day fraud was reported on the gap day.
    Returns (dataset root, every row written with its ``date``)."""
    root = tmp_path_factory.mktemp("gap-dataset")
    days = {}
    for s in world.manifest.shards:
        frame = read_shards(world.root, [s])
        days[s.date] = frame.assign(reported_at=frame["event_time"].where(frame["label"] == 1) + REPORT_DELAY)
    gap = days[GAP_DAY]
    trained = pd.concat([days[d] for d in days if GAP_SPLITS["train"].start <= d <= GAP_SPLITS["validation"].end])
    reported_on_the_gap_day = gap["reported_at"] < pd.Timestamp("2024-03-07", tz="UTC")
    new_to_the_model = ~gap["card_id"].isin(trained.loc[trained["label"] == 1, "card_id"])
    again = gap[reported_on_the_gap_day & new_to_the_model].head(GAP_CARDS_PAYING_AGAIN)
    assert len(again) == GAP_CARDS_PAYING_AGAIN
    days["2024-03-07"] = pd.concat([days["2024-03-07"], again.assign(
        transaction_id=[f"tx-gap-card-{i}" for i in range(len(again))], label=0,
        reported_at=pd.Series(pd.NaT, index=again.index, dtype=gap["reported_at"].dtype),
        event_time=again["event_time"] + pd.Timedelta(days=1))], ignore_index=True)
    shards = []
    for s in world.manifest.shards:  # the world's relative paths, under the new root
        _write_shard(root / s.path, days[s.date])
        shards.append(replace(s, rows=len(days[s.date]), frauds=int(days[s.date]["label"].sum()),
                              sha256=file_sha256(root / s.path)))
    schema = {"numeric": list(world.manifest.numeric_features), "categorical": world.manifest.categorical_features}
    publish_manifest(root, replace(world.manifest, splits=GAP_SPLITS, shards=tuple(shards),
                                   content_hash=content_hash(shards, schema)))
    return root, pd.concat([frame.assign(date=date) for date, frame in days.items()], ignore_index=True)


def test_a_fraud_reported_in_the_gap_removes_its_cards_later_payments(gap_world, world, config, version, tmp_path):
    root, rows = gap_world
    out = tmp_path / "scores.parquet"
    report = evaluate_window(f"models:/{config.model_name}/{version}", root, "2024-03-07", "2024-03-08", out)
    # The protocol's rule, on the rows as written: a card is known compromised on a day when it had a
    # fraud in train or validation, or when one of its frauds was reported before that day began.
    trained = rows["date"].between("2024-03-01", "2024-03-05")
    trained_fraud_cards = set(rows.loc[trained & (rows["label"] == 1), "card_id"])
    first_report = rows.groupby("card_id")["reported_at"].min()
    gap_report = rows[rows["date"] == GAP_DAY].groupby("card_id")["reported_at"].min()
    window = rows[rows["date"].between("2024-03-07", "2024-03-08")]
    day_start = window["event_time"].dt.floor("D")
    known = window["card_id"].isin(trained_fraud_cards) | (window["card_id"].map(first_report) < day_start)
    by_gap_report = ~window["card_id"].isin(trained_fraud_cards) & (window["card_id"].map(gap_report) < day_start)
    assert by_gap_report.sum() >= GAP_CARDS_PAYING_AGAIN
    assert report["n_known_removed"] == int(known.sum()) > int((known & ~by_gap_report).sum())
    kept = window[~known]
    scores = pd.read_parquet(out)
    assert scores["transaction_id"].tolist() == kept["transaction_id"].tolist()
    assert (report["n"], report["n_fraud"]) == (len(kept), int(kept["label"].sum()))
    np.testing.assert_allclose(scores["score"], factory.score(world.good, kept), rtol=1e-6)
    precision = card_precision_at_k(kept.assign(score=scores["score"].to_numpy()))
    assert precision > 0 and report["card_precision_at_100"] == pytest.approx(precision)


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
    code, out = invoke(world, ["promote", "--dataset-root", str(tmp_path / "no-dataset")])
    assert code == 1 and "HoldoutError: no usable holdout" in out  # an evaluation failure: exit 1, no record
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
