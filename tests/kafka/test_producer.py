"""``publish_records`` and ``fraudctl produce`` against the real embedded broker."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.config import PROJECT_ROOT
from pipeline.contract import Kind
from pipeline.kafka.admin import KafkaUnavailable
from pipeline.kafka.broker import free_port
from pipeline.kafka.producer import publish_records
from pipeline.kafka.reader import read_topic
from pipeline.kafka.settings import KafkaConfig
from pipeline.simulation import SimulationConfig, simulate

pytestmark = pytest.mark.broker

TINY = SimulationConfig(seed=5, start_date="2026-02-01", days=1, num_cards=200, num_merchants=150, fraud_rate=0.05)


def write_conf(conf_dir: Path, kafka: KafkaConfig) -> Path:
    """A conf directory for the CLI: the test's broker and topics, dev simulation settings."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "kafka.toml").write_text(
        f'bootstrap_servers = "{kafka.bootstrap_servers}"\n'
        f'transactions_topic = "{kafka.transactions_topic}"\n'
        f'labels_topic = "{kafka.labels_topic}"\n'
        f"request_timeout_s = {kafka.request_timeout_s}\n"
    )
    shutil.copy(PROJECT_ROOT / "conf" / "dev" / "simulation.toml", conf_dir / "simulation.toml")
    return conf_dir


@pytest.fixture(scope="module")
def sim():
    return simulate(TINY)


def test_publish_counts_every_record_and_keys_per_contract(kafka_config: KafkaConfig, sim) -> None:
    records = list(sim.label_records())
    progressed: list[int] = []
    report = publish_records(kafka_config, kafka_config.labels_topic, Kind.LABEL, records, progress=progressed.append)
    assert (report.sent, report.failed, report.errors) == (len(records), 0, [])
    assert sum(progressed) == len(records)
    back = read_topic(kafka_config, kafka_config.labels_topic)
    assert sorted(r.key for r in back) == sorted(r["transaction_id"].encode() for r in records)


def test_unsendable_records_are_counted_as_failed_not_dropped(kafka_config: KafkaConfig, sim) -> None:
    good = list(sim.transaction_records())[:20]
    too_big = {**good[0], "note": "x" * 2_000_000}  # over the client's message.max.bytes
    not_json = {**good[1], "score": float("nan")}
    report = publish_records(kafka_config, kafka_config.transactions_topic, Kind.TRANSACTION,
                             [*good, too_big, not_json])
    assert (report.sent, report.failed) == (20, 2)
    assert len(report.errors) == 2 and not report.ok
    assert len(read_topic(kafka_config, kafka_config.transactions_topic)) == 20


def test_unreachable_broker_fails_fast_with_a_clear_error() -> None:
    nowhere = KafkaConfig(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_s=2.0)
    with pytest.raises(KafkaUnavailable, match="unreachable"):
        publish_records(nowhere, "transactions", Kind.TRANSACTION, [{"card_id": "c"}])


def _mixed_file(path: Path, sim) -> tuple[list[dict], list[dict]]:
    txs, labels = list(sim.transaction_records())[:30], list(sim.label_records())[:10]
    lines = [json.dumps(r) for r in txs[:15]] + ["{broken", json.dumps({**txs[0], "currency": "euro"})]
    lines += [json.dumps(r) for r in labels] + [json.dumps(r) for r in txs[15:]]
    path.write_text("\n".join(lines) + "\n")
    return txs, labels


def test_produce_routes_each_kind_and_writes_rejects(kafka_config: KafkaConfig, sim, tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "conf", kafka_config)
    txs, labels = _mixed_file(tmp_path / "events.jsonl", sim)
    result = CliRunner().invoke(cli, ["produce", "--file", str(tmp_path / "events.jsonl")],
                                env={"FRAUD_CONF_DIR": str(conf)})
    assert result.exit_code == 0, result.output
    assert "line 16: malformed_json" in result.output
    assert "line 17: bad_currency (currency)" in result.output
    assert f"{kafka_config.transactions_topic} (transaction): sent 30, failed 0" in result.output
    assert f"{kafka_config.labels_topic} (label): sent 10, failed 0" in result.output
    assert "rejected: bad_currency 1, malformed_json 1" in result.output
    tx_back = read_topic(kafka_config, kafka_config.transactions_topic)
    label_back = read_topic(kafka_config, kafka_config.labels_topic)
    assert sorted(json.loads(r.value)["transaction_id"] for r in tx_back) == sorted(r["transaction_id"] for r in txs)
    assert all(r.key == json.loads(r.value)["card_id"].encode() for r in tx_back)
    assert sorted(json.loads(r.value)["transaction_id"] for r in label_back) == sorted(
        r["transaction_id"] for r in labels)
    rejects = [json.loads(line) for line in (tmp_path / "events.jsonl.rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [(16, "malformed_json"), (17, "bad_currency")]
    assert rejects[0]["raw"] == "{broken"


def test_produce_strict_sends_nothing_when_a_line_is_bad(kafka_config: KafkaConfig, sim, tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "conf", kafka_config)
    _mixed_file(tmp_path / "events.jsonl", sim)
    result = CliRunner().invoke(cli, ["produce", "--file", str(tmp_path / "events.jsonl"), "--strict"],
                                env={"FRAUD_CONF_DIR": str(conf)})
    assert result.exit_code == 1
    assert "2 bad lines" in result.output and "nothing sent" in result.output
    assert read_topic(kafka_config, kafka_config.transactions_topic) == []
    assert read_topic(kafka_config, kafka_config.labels_topic) == []
    assert not (tmp_path / "events.jsonl.rejects.jsonl").exists()


def test_produce_parquet_to_an_explicit_topic(kafka_config: KafkaConfig, sim, tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "conf", kafka_config)
    path = tmp_path / "tx.parquet"
    sim.transactions.to_parquet(path, index=False)
    result = CliRunner().invoke(cli, ["produce", "--file", str(path), "--topic", kafka_config.labels_topic],
                                env={"FRAUD_CONF_DIR": str(conf)})
    assert result.exit_code == 0, result.output
    back = read_topic(kafka_config, kafka_config.labels_topic)
    assert sorted(json.loads(r.value)["transaction_id"] for r in back) == sorted(sim.transactions["transaction_id"])
    assert read_topic(kafka_config, kafka_config.transactions_topic) == []


def test_produce_to_a_wrong_address_exits_non_zero_with_a_clear_message(
        kafka_config: KafkaConfig, sim, tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "conf", dataclasses.replace(kafka_config, request_timeout_s=2.0))
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(next(sim.transaction_records())) + "\n")
    nowhere = f"127.0.0.1:{free_port()}"
    result = CliRunner().invoke(cli, ["produce", "--file", str(path), "--bootstrap-servers", nowhere],
                                env={"FRAUD_CONF_DIR": str(conf)})
    assert result.exit_code == 1
    assert f"Kafka at {nowhere} is unreachable" in result.output and "--bootstrap-servers" in result.output
