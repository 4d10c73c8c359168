"""Preflight: what no training attempt can survive is refused before torchrun starts, naming its cause."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import PROJECT_ROOT
from pipeline.training.config import train_config_from_dict
from pipeline.training.data import DataConfigError
from pipeline.training.launch import Torchrun, TrainingCannotStart, run_training
from pipeline.training.preflight import EXIT_CANNOT_START, DatasetUnusable, check_startable
from pipeline.training.synthetic import SyntheticSpec
from tests.training.dataset_factory import train_config_dict, write_conf_dir, write_tiny_dataset

# What an ingest of a run date past the data used to publish: every split present, no rows.
EMPTY = SyntheticSpec(train_days=2, validation_days=1, test_days=1, rows_per_day=0, shards_per_date=2,
                      row_group_rows=100, num_cards=400, seed=11)
# 2 train days x 60 rows: less than one step of the tiny config's 256-row global batch.
SMALL = SyntheticSpec(train_days=2, validation_days=1, test_days=1, rows_per_day=60, shards_per_date=2,
                      row_group_rows=100, num_cards=400, seed=11)


@pytest.fixture(scope="module")
def empty_dataset(tmp_path_factory) -> Path:
    return write_tiny_dataset(tmp_path_factory.mktemp("empty-dataset"), EMPTY)


def tiny_config(overrides: dict | None = None):
    return train_config_from_dict(train_config_dict(overrides))


def test_an_empty_train_split_is_named_as_the_cause(empty_dataset):
    with pytest.raises(DatasetUnusable, match=r"0 rows and 0 frauds in its train split \(2026-01-01..2026-01-02\)"):
        check_startable(tiny_config(), empty_dataset, world_size=2)


def test_a_batch_bigger_than_the_train_split_says_how_many_rows_there_are(tmp_path):
    root = write_tiny_dataset(tmp_path / "small", SMALL)
    with pytest.raises(DataConfigError, match="has 120 rows for 2 processes"):
        check_startable(tiny_config(), root, world_size=2)


def test_a_global_batch_that_does_not_split_over_the_ranks_is_refused(tiny_dataset):
    with pytest.raises(DataConfigError, match="global_batch_size=255 does not split evenly over 2 processes"):
        check_startable(tiny_config({"data": {"global_batch_size": 255}}), tiny_dataset, world_size=2)


def test_a_dataset_that_trains_passes_and_its_manifest_is_returned(tiny_dataset, tiny_manifest):
    assert check_startable(tiny_config(), tiny_dataset, world_size=2).version == tiny_manifest.version


def test_run_training_launches_nothing_when_the_dataset_cannot_train(tmp_path, empty_dataset):
    conf = write_conf_dir(tmp_path / "conf")
    run_dir = tmp_path / "run"
    with pytest.raises(TrainingCannotStart, match=r"training not started: DatasetUnusable: .* train split"):
        run_training(None, run_dir, empty_dataset, Torchrun(nproc_per_node=2, max_restarts=3),
                     config_path=conf / "train.toml", log_file=tmp_path / "train.log", timeout_s=120)
    assert not run_dir.exists()  # torchrun never ran: no workers, no restarts


def test_run_training_reports_a_missing_dataset_without_launching(tmp_path):
    conf = write_conf_dir(tmp_path / "conf")
    with pytest.raises(TrainingCannotStart, match="ManifestError: no published dataset under .*fraudctl ingest"):
        run_training(None, tmp_path / "run", tmp_path / "nothing", Torchrun(nproc_per_node=2, max_restarts=3),
                     config_path=conf / "train.toml", log_file=tmp_path / "train.log", timeout_s=120)
    assert not (tmp_path / "run").exists()


def test_a_worker_started_without_the_launcher_exits_with_the_cannot_start_code(tmp_path, empty_dataset):
    conf = write_conf_dir(tmp_path / "conf")
    proc = subprocess.run([sys.executable, str(PROJECT_ROOT / "jobs" / "train.py"), "--config", str(conf / "train.toml"),
                           "--run-dir", str(tmp_path / "run"), "--dataset-root", str(empty_dataset)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_CANNOT_START == 2
    assert "training failed: DatasetUnusable:" in proc.stderr and "train split" in proc.stderr
