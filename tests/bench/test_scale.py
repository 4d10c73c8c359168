"""The scale bench's parts: shards that scale the portfolio, per-process peak RSS, the identity-check phase."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.bench import scale
from pipeline.contract import Kind
from pipeline.ingest.raw_commit import commit_raw_run, raw_table
from pipeline.ingest.raw_layout import RawStore
from pipeline.simulation import load_simulation_config, simulate

MB = 2**20


def test_roles_split_driver_jvm_and_each_executor_tree() -> None:
    # The local-cluster shape: driver Python -> driver JVM (master, workers) -> executor JVMs -> pyspark
    # daemon -> forked workers.
    processes = [
        scale.ProcessSample(10, 1, "python -m pipeline.bench.scale features", 100),
        scale.ProcessSample(11, 10, "java org.apache.spark.deploy.SparkSubmit pyspark-shell", 1_000),
        scale.ProcessSample(20, 11, f"java org.apache.spark.executor.{scale.EXECUTOR_MARK} --executor-id 0", 300),
        scale.ProcessSample(21, 20, "python -m pyspark.daemon", 40),
        scale.ProcessSample(22, 21, "python -m pyspark.daemon", 500),
        scale.ProcessSample(30, 11, f"java org.apache.spark.executor.{scale.EXECUTOR_MARK} --executor-id 1", 200),
        scale.ProcessSample(31, 30, "python -m pyspark.daemon", 7),
    ]
    assert scale.rss_by_role(10, processes) == {"driver_python": 100, "driver_jvm": 1_000, "executor:20": 840,
                                                "executor:30": 207}


def test_tree_peaks_measure_a_real_executor_tree() -> None:
    # A driver holding 64 MB whose "executor" child (marked on its command line) holds 160 MB.
    hold = "import time; b = bytearray({mb} * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep({s})"
    executor = f"import subprocess, sys; {hold.format(mb=160, s=2)}"
    driver = textwrap.dedent(f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", {executor!r}, "{scale.EXECUTOR_MARK}"])
        {hold.format(mb=64, s=2)}
        child.wait()
    """)
    process = subprocess.Popen([sys.executable, "-c", driver])
    with scale.TreePeaks(process.pid, interval_s=0.05) as peaks:
        process.wait()
    assert process.returncode == 0
    [executor_mb] = peaks.executor_mb()
    assert 160 <= executor_mb < 160 + 64
    assert 64 <= peaks.mb("driver_python") < 64 + 64
    assert peaks.mb("driver") == peaks.mb("driver_python")  # no other process outside the executor


def test_shards_are_disjoint_portfolios_of_the_dev_shape() -> None:
    base = load_simulation_config("dev")
    first, second = scale.shard_simulation(base, 0, quick=True), scale.shard_simulation(base, 1, quick=True)
    assert first.seed != second.seed
    assert first.num_cards == round(base.num_cards * scale.QUICK_CARD_SHARE)
    assert first.tx_per_card_per_day == base.tx_per_card_per_day
    small = [scale.shard_simulation(base, i, quick=True) for i in (0, 1)]
    sims = [simulate(dataclasses.replace(c, days=2, num_cards=200, num_merchants=100)) for c in small]
    frames = [scale.prefix_ids(s.transactions, i) for i, s in enumerate(sims)]
    for column in ("card_id", "merchant_id"):
        assert not set(frames[0][column]) & set(frames[1][column])
    assert not set(frames[0]["transaction_id"]) & set(frames[1]["transaction_id"])
    # Missing devices stay missing, present ones get the prefix.
    raw = sims[0].transactions["device_id"]
    assert frames[0]["device_id"].isna().tolist() == raw.isna().tolist()
    assert (frames[0]["device_id"][raw.notna()] == "s0." + raw[raw.notna()]).all()


def test_identity_check_phase_looks_the_night_up_in_the_index(tmp_path: Path, state_dir: Path) -> None:
    store = RawStore(tmp_path / "raw")
    night = scale.commit_shard_history(store, load_simulation_config("dev"), 0, quick=True)
    records = tmp_path / "night.parquet"
    pq.write_table(raw_table(Kind.TRANSACTION, night.transactions), records)
    before = scale.check_phase(store.root, records)
    assert before["records"] == len(night.transactions) > 0 and before["found"] == 0
    with store.locked():
        commit_raw_run(store, "night", night.transactions, night.labels)
    assert scale.check_phase(store.root, records)["found"] == len(night.transactions)


@pytest.mark.parametrize("sizes, expected", [([{"x": 2.0}, {"x": 3.0}], 1.5), ([{"x": 2.0}, {}], None)])
def test_growth_is_the_largest_size_over_the_smallest(sizes: list[dict], expected: float | None) -> None:
    assert scale.growth(sizes, "x") == expected
