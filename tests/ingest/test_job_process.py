"""The ingest job as its own process: spark-submit on a local cluster (executors in separate JVMs),
SIGKILL of the driver mid-run, the CLI's messages and exit codes, and a terminal that shows the
failure, not pages of Spark and librdkafka logs (those go to the run log)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from datetime import date

import psutil
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.config import PROJECT_ROOT
from pipeline.contract import Kind
from pipeline.datasets.manifest import load_manifest
from pipeline.ingest.config import load_ingest_config
from pipeline.ingest.job import run_nightly
from pipeline.ingest.progress import quiet
from pipeline.ingest.raw_layout import RawStore
from pipeline.kafka.broker import EmbeddedBroker, free_port
from pipeline.kafka.producer import publish_records
from pipeline.kafka.settings import KafkaConfig
from tests.ingest.kafka_helpers import small_simulation
from tests.ingest.process_helpers import job_env, local_cluster_logs, write_conf_dir

pytestmark = [pytest.mark.broker, pytest.mark.spark]
SPARK_SUBMIT = PROJECT_ROOT / ".venv" / "bin" / "spark-submit"
INGEST_JOB = PROJECT_ROOT / "jobs" / "ingest.py"
# A failed run's terminal: our one-line failure (the JVM's own lines go to the run log too); the
# rest is slack. Before the run log existed a lost broker printed over a thousand lines.
MAX_STDERR_LINES = 20


def publish(kafka, sim) -> None:
    assert publish_records(kafka, kafka.transactions_topic, Kind.TRANSACTION, sim.transaction_records()).ok
    assert publish_records(kafka, kafka.labels_topic, Kind.LABEL, sim.label_records()).ok


@pytest.mark.slow
def test_spark_submit_on_a_local_cluster_runs_the_source_and_the_index_lookup_on_executors(
        tmp_path, state_dir, kafka_config, spark):
    # The stored night comes from an in-process run (the session's Spark): one spark-submit on the local
    # cluster then reads the resends, so its executors run both the Kafka source and the index look-up.
    sim = small_simulation(days=30, num_cards=100)
    publish(kafka_config, sim)
    config = load_ingest_config("dev")
    config = dataclasses.replace(config, dataset=dataclasses.replace(config.dataset, gap_days=0))  # as write_conf_dir
    stored = run_nightly(config, kafka_config, date(2026, 1, 30), spark=spark, progress=quiet())
    assert (stored.accounting[0].read, stored.accounting[0].valid) == (len(sim.transactions), len(sim.transactions))
    assert len(RawStore(state_dir / "raw").committed_files(Kind.TRANSACTION)) > 0

    # A resend of stored payments. With index_lookup = "spark" the only look-up in the index is the job of
    # 4 lookup tasks, which a local cluster runs on its executors: every resend found is found there.
    resent = list(sim.transaction_records())[:200]
    assert publish_records(kafka_config, kafka_config.transactions_topic, Kind.TRANSACTION, resent).ok
    conf = write_conf_dir(tmp_path / "conf", kafka_config, {"shuffle_partitions": "2", "index_lookup": '"spark"',
                                                            "index_lookup_tasks": "4"})
    report_path = tmp_path / "report.json"
    cmd = [str(SPARK_SUBMIT), "--master", "local-cluster[2,1,1024]", "--conf", "spark.driver.host=127.0.0.1",
           str(PROJECT_ROOT / "jobs" / "ingest.py"), "--run-date", "2026-01-30", "--report-json", str(report_path)]
    with local_cluster_logs() as logs:
        done = subprocess.run(cmd, env=job_env(state_dir, conf), cwd=PROJECT_ROOT, capture_output=True, text=True,
                              timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    tx = report["accounting"][0]
    assert (tx["read"], tx["valid"], tx["duplicates"]) == (200, 0, 200)
    assert "Ingest run" in done.stdout and "fraud-dev @" in done.stdout  # the summary tables
    # Two executor JVMs ran tasks, among them the Kafka read (stage 0); the driver ran none.
    assert len(logs) == 2 and all("Running task" in text for text in logs.values())
    assert any("in stage 0.0" in text for text in logs.values())
    manifest = load_manifest(state_dir / "datasets" / "fraud-dev")
    assert manifest.content_hash == report["dataset"]["content_hash"] == stored.dataset.content_hash


def _wait_for_landing(raw, proc, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if list(raw.glob("transactions/*/run_id=*/.*.tmp-*")) or list(raw.glob("transactions/*/run_id=*/*.parquet")):
            return
        assert proc.poll() is None, "the job ended before it was killed"
        time.sleep(0.05)
    raise AssertionError("the job never started landing records")


@pytest.mark.slow
def test_sigkill_mid_run_leaves_the_previous_state_and_the_rerun_completes(tmp_path, state_dir, kafka_config, spark):
    first, second = small_simulation(days=20, num_cards=150), small_simulation(days=10, num_cards=150,
                                                                               start_date="2026-01-21")
    publish(kafka_config, first)
    config = load_ingest_config("dev")
    # Ingest mechanics on a month of data: no protocol gap (as write_conf_dir gives the job process).
    config = dataclasses.replace(config, dataset=dataclasses.replace(config.dataset, gap_days=0))
    before = run_nightly(config, kafka_config, date(2026, 1, 20), spark=spark, progress=quiet())
    store = RawStore(config.raw.root())
    committed = store.offsets.path.read_bytes()
    latest = (config.dataset.dataset_root() / "LATEST").read_text()

    publish(kafka_config, second)
    conf = write_conf_dir(tmp_path / "conf", kafka_config, {"max_records_per_split": "400"})
    proc = subprocess.Popen([str(PROJECT_ROOT / ".venv" / "bin" / "python"), str(PROJECT_ROOT / "jobs" / "ingest.py"),
                             "--run-date", "2026-01-30"], env=job_env(state_dir, conf), cwd=PROJECT_ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    family = [proc.pid]
    try:
        _wait_for_landing(store.root, proc, timeout_s=180)
        family += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        for pid in family:  # the driver, then the JVM and Python workers it started
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
    assert store.offsets.path.read_bytes() == committed  # nothing committed by the killed run
    assert (config.dataset.dataset_root() / "LATEST").read_text() == latest

    after = run_nightly(config, kafka_config, date(2026, 1, 30), spark=spark, progress=quiet())
    tx = after.accounting[0]
    assert (tx.read, tx.valid, tx.duplicates) == (len(second.transactions), len(second.transactions), 0)
    ids = [i for f in store.committed_files(Kind.TRANSACTION)
           for i in pq.read_table(f, columns=["transaction_id"])["transaction_id"].to_pylist()]
    assert len(ids) == len(set(ids)) == len(first.transactions) + len(second.transactions)
    assert after.dataset.version != before.dataset.version
    assert load_manifest(config.dataset.dataset_root()).version == after.dataset.version


def test_cli_explains_an_unreachable_broker_and_a_missing_topic(tmp_path, state_dir, kafka_config, monkeypatch):
    dead = dataclasses.replace(kafka_config, bootstrap_servers=f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("FRAUD_CONF_DIR", str(write_conf_dir(tmp_path / "dead", dead, request_timeout_s=2)))
    result = CliRunner().invoke(cli, ["ingest", "--run-date", "2026-01-30"])
    assert result.exit_code == 1 and "unreachable" in result.output and "fraudctl broker start" in result.output
    missing = dataclasses.replace(kafka_config, transactions_topic="no-such-topic")
    monkeypatch.setenv("FRAUD_CONF_DIR", str(write_conf_dir(tmp_path / "missing", missing, request_timeout_s=5)))
    result = CliRunner().invoke(cli, ["ingest", "--run-date", "2026-01-30"])
    assert result.exit_code == 1 and "topic 'no-such-topic' does not exist" in result.output


def test_cli_refuses_bad_arguments_and_impossible_backfills(tmp_path, state_dir, kafka_config, monkeypatch):
    monkeypatch.setenv("FRAUD_CONF_DIR", str(write_conf_dir(tmp_path / "conf", kafka_config)))
    runner = CliRunner()
    assert runner.invoke(cli, ["ingest"]).exit_code == 2
    assert runner.invoke(cli, ["ingest", "--run-date", "2026-01-30", "--end", "2026-01-31"]).exit_code == 2
    assert runner.invoke(cli, ["ingest", "--run-date", "30/01/2026"]).exit_code == 2
    result = runner.invoke(cli, ["ingest", "--start", "2026-01-01", "--end", "2026-01-20"])
    assert result.exit_code == 1 and "raw store is empty" in result.output
    result = runner.invoke(cli, ["ingest", "--start", "2026-01-05", "--end", "2026-01-20"])
    assert result.exit_code == 1 and "spans 16 days" in result.output and "use --start 2026-01-01" in result.output


def _run_log(state) -> str:
    logs = list((state / "logs" / "ingest").glob("*.log"))
    assert len(logs) == 1, logs
    return logs[0].read_text()


def test_an_unreachable_broker_fails_in_one_line_and_the_client_lines_go_to_the_run_log(tmp_path, state_dir):
    dead = KafkaConfig(bootstrap_servers=f"127.0.0.1:{free_port()}")
    conf = write_conf_dir(tmp_path / "conf", dead, request_timeout_s=5)  # librdkafka retries for 5s
    done = subprocess.run([sys.executable, str(INGEST_JOB), "--run-date", "2026-01-30"], env=job_env(state_dir, conf),
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) < MAX_STDERR_LINES, done.stderr[-3000:]
    assert lines[-1].startswith("ingest failed: KafkaUnavailable: Kafka at 127.0.0.1:")
    assert "rdkafka" not in done.stderr + done.stdout
    assert "Connection refused" in _run_log(state_dir)


def _stop_at(proc: subprocess.Popen, marker: str, action, timeout_s: float) -> list[str]:
    """Read ``proc``'s stdout until a line contains ``marker``, then call ``action``; the lines read."""
    lines, deadline = [], time.monotonic() + timeout_s
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            action()
            return lines
        assert time.monotonic() < deadline, lines
    raise AssertionError(f"{marker!r} never printed: {lines}")


@pytest.mark.slow
def test_a_broker_lost_mid_run_fails_in_one_line_and_spark_and_client_logs_go_to_the_run_log(tmp_path, state_dir):
    broker = EmbeddedBroker("127.0.0.1", free_port(), tmp_path / "broker.log")  # ours alone: it gets stopped
    broker.start()
    proc = None
    try:
        kafka = KafkaConfig(bootstrap_servers=broker.bootstrap_servers)
        broker.create_topics(kafka.topics(), kafka.partitions)
        publish(kafka, small_simulation(days=5, num_cards=100))
        conf = write_conf_dir(tmp_path / "conf", kafka, {"stall_timeout_s": "3.0"}, request_timeout_s=5)
        proc = subprocess.Popen([sys.executable, str(INGEST_JOB), "--run-date", "2026-01-30"],
                                env={**job_env(state_dir, conf), "PYTHONUNBUFFERED": "1"}, cwd=PROJECT_ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Offsets are planned before Spark starts; the read tasks then find no broker.
        _stop_at(proc, "plan offsets", broker.stop, timeout_s=120)
        _, stderr = proc.communicate(timeout=400)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        broker.stop()
    assert proc.returncode == 1
    lines = stderr.splitlines()
    assert len(lines) < MAX_STDERR_LINES, stderr[-3000:]
    assert "ingest failed: KafkaReadError: " in lines[-1] and "stalled" in lines[-1] and "run log" in lines[-1]
    log = _run_log(state_dir)
    assert "Connection refused" in log  # librdkafka, from the read tasks
    assert "ERROR Executor: Exception in task" in log and "KafkaReadError" in log  # Spark, with the trace
    # The JVM's own stderr line (outside log4j) is in the run log, not on the terminal.
    assert "Using incubator modules" in log and "Using incubator modules" not in stderr
