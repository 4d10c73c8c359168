"""Per-process peak RSS: roles in a Spark application's process tree, sampled from real processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

from pipeline.bench import process_rss


def test_roles_split_driver_jvm_and_each_executor_tree() -> None:
    # The local-cluster shape: driver Python -> driver JVM (master, workers) -> executor JVMs -> pyspark
    # daemon -> forked workers.
    processes = [
        process_rss.ProcessSample(10, 1, "python -m pipeline.bench.scale features", 100),
        process_rss.ProcessSample(11, 10, "java org.apache.spark.deploy.SparkSubmit pyspark-shell", 1_000),
        process_rss.ProcessSample(20, 11, f"java org.apache.spark.executor.{process_rss.EXECUTOR_MARK} --executor-id 0", 300),
        process_rss.ProcessSample(21, 20, "python -m pyspark.daemon", 40),
        process_rss.ProcessSample(22, 21, "python -m pyspark.daemon", 500),
        process_rss.ProcessSample(30, 11, f"java org.apache.spark.executor.{process_rss.EXECUTOR_MARK} --executor-id 1", 200),
        process_rss.ProcessSample(31, 30, "python -m pyspark.daemon", 7),
    ]
    assert process_rss.rss_by_role(10, processes) == {"driver_python": 100, "driver_jvm": 1_000, "executor:20": 840,
                                                "executor:30": 207}


def test_tree_peaks_measure_a_real_executor_tree() -> None:
    # A driver holding 64 MB whose "executor" child (marked on its command line) holds 160 MB.
    hold = "import time; b = bytearray({mb} * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep({s})"
    executor = f"import subprocess, sys; {hold.format(mb=160, s=2)}"
    driver = textwrap.dedent(f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", {executor!r}, "{process_rss.EXECUTOR_MARK}"])
        {hold.format(mb=64, s=2)}
        child.wait()
    """)
    process = subprocess.Popen([sys.executable, "-c", driver])
    with process_rss.TreePeaks(process.pid, interval_s=0.05) as peaks:
        process.wait()
    assert process.returncode == 0
    [executor_mb] = peaks.executor_mb()
    assert 160 <= executor_mb < 160 + 64
    assert 64 <= peaks.mb("driver_python") < 64 + 64
    assert peaks.mb("driver") == peaks.mb("driver_python")  # no other process outside the executor


def test_own_peak_is_the_growth_inside_the_block_however_short_and_freed():
    with process_rss.OwnPeak() as idle:
        pass
    with process_rss.OwnPeak() as touched:
        block = np.ones(64 * process_rss.MB, np.uint8)  # 64 MB touched, then freed within the block
        del block
    assert idle.growth_mb < 8
    assert 60 <= touched.growth_mb < 80
