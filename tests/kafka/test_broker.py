"""The embedded Tansu broker as started by `fraudctl broker` and by fixtures."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.kafka.admin import topic_partitions
from pipeline.kafka.broker import BrokerError, EmbeddedBroker, broker_status, free_port
from pipeline.kafka.settings import KafkaConfig


def test_cli_start_status_stop_creates_topics_and_stops_only_its_pid(state_dir, monkeypatch):
    port = free_port()
    runner = CliRunner()
    result = runner.invoke(cli, ["broker", "start", "--port", str(port)])
    assert result.exit_code == 0, result.output
    info = broker_status(state_dir)
    try:
        assert info["port"] == port and (state_dir / "broker" / "broker.log").is_file()
        kafka = KafkaConfig(bootstrap_servers=f"127.0.0.1:{port}")
        assert topic_partitions(kafka, "transactions") == [0, 1, 2, 3]
        assert topic_partitions(kafka, "fraud-labels") == [0, 1, 2, 3]

        again = runner.invoke(cli, ["broker", "start", "--port", str(free_port())])
        assert again.exit_code == 1 and "already running" in again.output

        status = runner.invoke(cli, ["broker", "status"])
        assert status.exit_code == 0 and f"pid {info['pid']}" in status.output
    finally:
        stopped = runner.invoke(cli, ["broker", "stop"])
    assert stopped.exit_code == 0 and f"stopped broker pid {info['pid']}" in stopped.output
    assert broker_status(state_dir) is None
    with pytest.raises(ProcessLookupError):
        os.kill(info["pid"], 0)
    assert runner.invoke(cli, ["broker", "status"]).exit_code == 1


def test_stop_ignores_a_pidfile_pointing_at_another_process(state_dir):
    (state_dir / "broker").mkdir()
    # Our own pid is alive but is not a Tansu broker: stop must not signal it.
    (state_dir / "broker" / "broker.json").write_text(
        f'{{"pid": {os.getpid()}, "host": "127.0.0.1", "port": 1, "log": "x", "started_at": "t"}}'
    )
    result = CliRunner().invoke(cli, ["broker", "stop"])
    assert result.exit_code == 0 and "no broker started by this project" in result.output


def test_start_on_a_busy_port_says_so(kafka_broker, tmp_path):
    clash = EmbeddedBroker("127.0.0.1", kafka_broker.port, tmp_path / "b.log")
    with pytest.raises(BrokerError, match="already in use"):
        clash.start(timeout_s=5)
