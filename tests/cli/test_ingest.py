"""``fraudctl ingest`` and ``spark-submit jobs/ingest.py``: what they tell the operator, and what they
do before Spark starts (a refused backfill, the interpreter the executors run, where LATEST points)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli.ingest import latest_note
from pipeline.cli.main import cli
from pipeline.datasets.manifest import latest_version, load_manifest, publish_manifest
from pipeline.ingest.config import load_ingest_config
from pipeline.ingest.dataset_builder import DatasetSummary
from pipeline.ingest.job import dataset_stage_counts
from tests.registry import factory

ROOT = Path(__file__).resolve().parents[2]


def load_job():
    spec = importlib.util.spec_from_file_location("ingest_job_under_test", ROOT / "jobs" / "ingest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_refused_backfill_names_every_term_of_the_window(tmp_path, monkeypatch):
    # The message summed 14 + 3 + 3 and called it 27: gap_days was left out.
    monkeypatch.setenv("FRAUD_STATE_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, ["--env", "dev", "ingest", "--start", "2026-10-12", "--end", "2026-10-31"])
    assert result.exit_code == 1, result.output
    dataset = load_ingest_config("dev").dataset
    assert dataset.gap_days > 0  # the case the message got wrong
    terms = (f"train_days {dataset.train_days} + validation_days {dataset.validation_days} + "
             f"gap_days {dataset.gap_days} + test_days {dataset.test_days}")
    assert f"spans 20 days, but [dataset] in ingest.toml lays out {dataset.window_days} ({terms})" in result.output
    assert dataset.train_days + dataset.validation_days + dataset.gap_days + dataset.test_days == dataset.window_days
    assert "use --start 2026-10-05 --end 2026-10-31" in result.output
    assert not (tmp_path / "datasets").exists()  # refused before anything was built


def test_the_stage_line_says_why_its_rows_exceed_the_splits_table():
    splits = {"train": {"rows": 800, "frauds": 8}, "validation": {"rows": 100, "frauds": 1},
              "test": {"rows": 100, "frauds": 2}}
    summary = DatasetSummary("fraud-dev", "/d", "v1", "/d/m.json", "ff", "2026-11-29", rows=1300, frauds=14,
                             splits=splits, reused=False)
    counts = dataset_stage_counts(summary)
    assert (counts["rows"], counts["frauds"]) == (1300, 14)
    assert counts["gap"].startswith("300 rows, 3 frauds (in rows, in no split")
    assert list(counts) == ["version", "rows", "frauds", "gap", "reused"]
    assert "gap" not in dataset_stage_counts(replace(summary, rows=1000, frauds=11))  # no gap, nothing to explain


@pytest.mark.parametrize(("given", "expected"), [
    (".venv/bin/python", "/repo/.venv/bin/python"),  # the README's line: executors run elsewhere
    ("/opt/venv/bin/python", "/opt/venv/bin/python"),
    ("python3", "python3"),  # looked up on the PATH, wherever it runs
])
def test_a_relative_pyspark_python_is_made_absolute_before_spark_starts(given, expected):
    environ = {"PYSPARK_PYTHON": given}
    load_job().absolute_pyspark_python(environ, Path("/repo"))
    assert environ["PYSPARK_PYTHON"] == expected


def test_without_pyspark_python_nothing_is_set():
    environ: dict[str, str] = {}
    load_job().absolute_pyspark_python(environ, Path("/repo"))
    assert environ == {}


def test_a_backfill_of_an_older_range_does_not_move_latest_back(tmp_path):
    # The gate, training and evaluate default to LATEST: an older backfill must not become their data.
    newer = factory.write_dataset(tmp_path, start="2024-03-09")  # label cutoff 2024-03-16
    older = factory.write_dataset(tmp_path, start="2024-03-01")  # label cutoff 2024-03-08, published after
    assert latest_version(tmp_path) == newer.version
    assert load_manifest(tmp_path).label_cutoff == newer.label_cutoff
    assert load_manifest(tmp_path, older.version).version == older.version  # published, read by its version

    note = latest_note(summary_of(tmp_path, older))
    assert note is not None and f"LATEST stays {newer.version}" in note and f"--dataset-version {older.version}" in note
    assert latest_note(summary_of(tmp_path, newer)) is None

    publish_manifest(tmp_path, newer)  # a rerun of the newest night: LATEST stays on it
    latest = factory.write_dataset(tmp_path, start="2024-03-17")  # a later night moves it on
    assert latest_version(tmp_path) == latest.version


def summary_of(root: Path, manifest) -> DatasetSummary:
    return DatasetSummary(manifest.dataset, str(root), manifest.version, "", manifest.content_hash,
                          manifest.label_cutoff, rows=0, frauds=0, splits={}, reused=False)
