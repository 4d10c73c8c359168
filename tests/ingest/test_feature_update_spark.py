"""The feature table's spark engine on ``local-cluster[2,1,1024]`` against its local engine: over
nights with late payments and back-dated fraud reports (the scenario of ``test_feature_update.py``),
the same dates computed, the same fingerprints and the same ``features.parquet`` bytes; a second
run reuses every date; hot keys split into chunks change no byte; a run killed while publishing
leaves whole partitions, which the next run completes.

The Spark runs happen in one subprocess (this module's ``__main__``): a process holds one
SparkContext, and the test process already has its local one. It writes the tables and a JSON of
what each update returned; the tests read both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.datasets.feature_table import FINGERPRINT_FILE, LOOKBACK_DIR, PARTITION_FILE, FeatureTable
from pipeline.features import definitions as fd
from pipeline.ingest.dataset_plan import plan_nightly
from pipeline.ingest.feature_update import plan_dates, update_feature_table
from pipeline.ingest.raw_layout import RawStore
from tests.ingest.test_feature_update import FIRST_NIGHT, config, deliver

MASTER = "local-cluster[2,1,1024]"
NIGHTS = 3
HOT_KEY_ROWS = 30  # the simulation's busiest merchants and cards see far more payments in a window
ROWS_PER_TASK = 2_000  # the scenario's window reads far more payments: more shuffle partitions than 4
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def plan_of(night: int):
    return plan_nightly(FIRST_NIGHT + timedelta(days=night), config().dataset)


def _snapshot(table: FeatureTable, to: Path) -> None:
    shutil.copytree(table.root, to, ignore=shutil.ignore_patterns(LOOKBACK_DIR))


def run_nights(out: Path) -> None:
    """The subprocess: every update of the tests, results to ``out/results.json``."""
    from pipeline.ingest.config import SparkConfig
    from pipeline.ingest.session import build_spark_session
    from tests.ingest.kafka_helpers import small_simulation

    spark = build_spark_session(SparkConfig(master=MASTER, app_name="feature-engines", shuffle_partitions=4,
                                            log_level="ERROR"))
    cfg, store, delivered, results = config(), RawStore(out / "state" / "raw"), set(), {}
    sim = small_simulation(days=44, num_cards=150)  # the scenario test_feature_update.py runs
    local, on_spark = FeatureTable(out / "local"), FeatureTable(out / "spark")

    def spark_update(table: FeatureTable, night: int, hot_key_rows: int | None = HOT_KEY_ROWS,
                     rows_per_task: int | None = None) -> dict:
        return update_feature_table(store, table, plan_of(night), cfg.features, 28, engine="spark", spark=spark,
                                    hot_key_rows=hot_key_rows, rows_per_task=rows_per_task).to_dict()

    for night in range(NIGHTS):
        deliver(store, sim, night, delivered)
        with store.locked():
            results[f"local-{night}"] = update_feature_table(store, local, plan_of(night), cfg.features, 28).to_dict()
            results[f"spark-{night}"] = spark_update(on_spark, night)
        _snapshot(local, out / f"night-{night}" / "local")
        _snapshot(on_spark, out / f"night-{night}" / "spark")
    last = NIGHTS - 1
    with store.locked():
        results["spark-again"] = spark_update(on_spark, last)
        results["split"] = spark_update(FeatureTable(out / "split"), last, rows_per_task=ROWS_PER_TASK)
        results["unsplit"] = spark_update(FeatureTable(out / "unsplit"), last, hot_key_rows=None)
        killed = FeatureTable(out / "killed")  # night 0's table, brought to the last night, killed
        shutil.copytree(out / "night-0" / "spark", killed.root)
        published = []

        def publish_then_die(self, day, staging, rows, fingerprint, inputs):
            if published:
                raise KeyboardInterrupt("killed between two dates")
            published.append(day.isoformat())
            return original(self, day, staging, rows, fingerprint, inputs)

        original = FeatureTable.publish_staged
        FeatureTable.publish_staged = publish_then_die
        try:
            spark_update(killed, last)
        except KeyboardInterrupt:
            results["killed"] = published
        finally:
            FeatureTable.publish_staged = original
    (out / "results.json").write_text(json.dumps(results, indent=1))
    spark.stop()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("engines")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_MASTER")}
    env.update(FRAUD_STATE_DIR=str(out / "state"), PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, "-m", "tests.ingest.test_feature_update_spark", str(out)], env=env,
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]
    return out, json.loads((out / "results.json").read_text())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_same_partitions(mine: Path, reference: Path, days: list[date]) -> None:
    """Both tables hold ``days`` with identical ``features.parquet`` bytes and fingerprint records."""
    for day in days:
        name = f"date={day.isoformat()}"
        assert sha256(mine / name / PARTITION_FILE) == sha256(reference / name / PARTITION_FILE), day
        assert (mine / name / FINGERPRINT_FILE).read_text() == (reference / name / FINGERPRINT_FILE).read_text(), day


@pytest.mark.spark
@pytest.mark.slow
def test_spark_engine_writes_the_local_engines_partitions_byte_for_byte(runs):
    out, results = runs
    for night in range(NIGHTS):
        mine, reference = results[f"spark-{night}"], results[f"local-{night}"]
        assert (mine["engine"], reference["engine"]) == ("spark", "local")
        assert mine["computed"] == reference["computed"], night
        assert_same_partitions(out / f"night-{night}" / "spark", out / f"night-{night}" / "local", plan_dates(plan_of(night)))
    assert "2026-02-07" in results["spark-1"]["computed"]  # the late payments reached their date
    assert "2026-02-04" in results["spark-2"]["computed"]  # the back-dated reports reached theirs
    rows = pq.read_table(out / "night-2" / "spark" / "date=2026-02-07" / PARTITION_FILE)
    assert rows.num_rows > 100 and rows.column(fd.card_count(30)).to_numpy().max() > 0  # real rows, not empty files


@pytest.mark.spark
@pytest.mark.slow
def test_a_second_spark_run_reuses_every_date(runs):
    _, results = runs
    again = results["spark-again"]
    assert again["computed"] == [] and again["reused"] == len(plan_dates(plan_of(NIGHTS - 1)))
    assert "kernel_calls" not in again  # no job ran


@pytest.mark.spark
@pytest.mark.slow
def test_hot_keys_and_task_shares_split_across_calls_and_partitions_change_no_byte(runs):
    out, results = runs
    # The last night's whole window into empty tables: keys above HOT_KEY_ROWS split and at most
    # ROWS_PER_TASK payments read per shuffle partition, or neither.
    assert results["split"]["computed"] == results["unsplit"]["computed"]
    assert results["unsplit"]["shuffle_partitions"] == 4  # the session's spark.sql.shuffle.partitions
    assert results["split"]["shuffle_partitions"] > 4
    assert results["unsplit"]["computed"] == [d.isoformat() for d in plan_dates(plan_of(NIGHTS - 1))]
    split, whole = results["split"]["kernel_calls"], results["unsplit"]["kernel_calls"]
    for kernel_pass in ("merchant", "card"):
        _, _, groups, largest = split[kernel_pass]
        # Hot keys became several groups (chunks), none as large as the largest whole key.
        assert groups > whole[kernel_pass][2] and largest < whole[kernel_pass][3], kernel_pass
    for table in ("split", "unsplit"):
        assert_same_partitions(out / table, out / f"night-{NIGHTS - 1}" / "local", plan_dates(plan_of(NIGHTS - 1)))


@pytest.mark.spark
@pytest.mark.slow
def test_a_spark_run_killed_while_publishing_leaves_whole_partitions(runs, tmp_path, monkeypatch):
    out, results = runs
    last, reference, before = NIGHTS - 1, out / f"night-{NIGHTS - 1}" / "local", out / "night-0" / "spark"
    killed = FeatureTable(tmp_path / "killed")
    shutil.copytree(out / "killed", killed.root)
    [first] = results["killed"]
    for directory in killed.root.glob("date=*"):  # whole: both files; each the old or the new partition
        assert sorted(p.name for p in directory.iterdir()) == sorted([FINGERPRINT_FILE, PARTITION_FILE])
        source = (reference if directory.name == f"date={first}" else before) / directory.name
        assert sha256(directory / PARTITION_FILE) == sha256(source / PARTITION_FILE), directory.name
        assert (directory / FINGERPRINT_FILE).read_text() == (source / FINGERPRINT_FILE).read_text(), directory.name
    staged = [p for p in killed.root.iterdir() if p.name.startswith(".build-")]
    assert staged and all((p / PARTITION_FILE).is_file() for p in staged)  # executors' files, never published

    # The next night (the local engine here: same bytes) discards them and computes the rest.
    monkeypatch.setenv("FRAUD_STATE_DIR", str(out / "state"))
    store = RawStore(out / "state" / "raw")
    with store.locked():
        again = update_feature_table(store, killed, plan_of(last), config().features, 28)
    assert first not in again.computed and len(again.computed) == len(results["spark-2"]["computed"]) - 1
    assert not [p for p in killed.root.iterdir() if p.name.startswith(".")]
    assert_same_partitions(killed.root, reference, plan_dates(plan_of(last)))


@pytest.mark.parametrize("rows, floor, rows_per_task, expected", [
    (10, 4, None, 4),            # no bound: the session's partitions
    (3_000, 4, 1_000, 4),        # under the bound at the floor
    (4_001, 4, 1_000, 5),        # one payment over: one more partition
    (15_400_000, 4, 1_000_000, 16),
])
def test_night_partitions_bound_each_partitions_share_of_the_payments_read(rows, floor, rows_per_task, expected):
    from pipeline.ingest.feature_update_spark import night_partitions

    assert night_partitions(rows, floor, rows_per_task) == expected


def test_an_unknown_engine_is_refused_with_the_key_to_fix(tmp_path):
    from pipeline.config import ConfigError
    from pipeline.ingest.config import validate_ingest_config
    from pipeline.ingest.feature_update import FeatureEngineError

    cfg = config()
    wrong = dataclasses.replace(cfg, features=dataclasses.replace(cfg.features, engine="gpu"))
    with pytest.raises(ConfigError, match="features.engine must be one of local, spark, got 'gpu'"):
        validate_ingest_config(wrong)
    with pytest.raises(FeatureEngineError, match="needs a SparkSession"):
        update_feature_table(RawStore(tmp_path / "raw"), FeatureTable(tmp_path / "t"), plan_of(0), cfg.features, 28,
                             engine="spark")
    assert not (tmp_path / "t").exists()


if __name__ == "__main__":
    run_nights(Path(sys.argv[1]))
