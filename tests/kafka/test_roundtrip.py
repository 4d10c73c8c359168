"""Simulated events survive Kafka unchanged: publish, read every partition back, compare by id."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.config import load_section
from pipeline.contract import Kind, validate_event
from pipeline.kafka.producer import publish_records
from pipeline.kafka.reader import read_topic
from pipeline.kafka.settings import KafkaConfig
from pipeline.simulation import SimulationConfig, simulate
from tests.kafka.test_producer import write_conf

pytestmark = pytest.mark.broker

CONFIG = SimulationConfig(seed=21, start_date="2026-04-01", days=2, num_cards=1500, num_merchants=300)


def _by_id(values: list[bytes]) -> dict[str, dict]:
    parsed = [json.loads(v) for v in values]
    return {p["transaction_id"]: p for p in parsed}


def test_simulated_events_round_trip_exactly(kafka_config: KafkaConfig) -> None:
    sim = simulate(CONFIG)
    txs, labels = list(sim.transaction_records()), list(sim.label_records())
    assert len(txs) > 3000 and len(labels) > 0

    sent_tx = publish_records(kafka_config, kafka_config.transactions_topic, Kind.TRANSACTION, txs)
    sent_labels = publish_records(kafka_config, kafka_config.labels_topic, Kind.LABEL, labels)
    assert (sent_tx.sent, sent_tx.failed, sent_labels.sent, sent_labels.failed) == (len(txs), 0, len(labels), 0)

    tx_back = read_topic(kafka_config, kafka_config.transactions_topic)
    assert len(tx_back) == len(txs)
    assert _by_id([r.value for r in tx_back]) == {r["transaction_id"]: r for r in txs}
    assert {r.partition for r in tx_back} == {0, 1, 2, 3}
    partitions_of_card: dict[bytes, set[int]] = defaultdict(set)
    for r in tx_back:
        assert r.key == json.loads(r.value)["card_id"].encode()
        partitions_of_card[r.key].add(r.partition)
        assert validate_event(r.value, Kind.TRANSACTION)[1] is None
    # Keyed by card: all of a card's payments in one partition, in event-time order.
    assert all(len(p) == 1 for p in partitions_of_card.values())
    first_partition = [json.loads(r.value)["event_time"] for r in tx_back if r.partition == 0]
    assert first_partition == sorted(first_partition)

    label_back = read_topic(kafka_config, kafka_config.labels_topic)
    assert len(label_back) == len(labels)
    assert _by_id([r.value for r in label_back]) == {r["transaction_id"]: r for r in labels}
    assert all(r.key == json.loads(r.value)["transaction_id"].encode() for r in label_back)


def test_simulate_cli_writes_files_and_publishes(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "conf", kafka_config)
    args = ["simulate", "--days", "1", "--cards", "800", "--seed", "4", "--start-date", "2026-05-01",
            "--fraud-rate", "0.02", "--out", str(tmp_path / "out"), "--format", "parquet", "--publish"]
    result = CliRunner().invoke(cli, args, env={"FRAUD_CONF_DIR": str(conf)})
    assert result.exit_code == 0, result.output
    conf_file = load_section(SimulationConfig, "simulation", path=conf / "simulation.toml")
    sim = simulate(dataclasses.replace(conf_file, days=1, num_cards=800, seed=4, start_date="2026-05-01",
                                       fraud_rate=0.02))
    assert f"simulated {len(sim.transactions)} transactions" in result.output
    for name in ("card_testing", "account_takeover", "compromised_merchant", "geo_impossible", "amount_threshold",
                 "low_and_slow"):
        assert f"{name} {sim.pattern_counts()[name]}" in result.output
    assert "events/s" in result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["labels.parquet", "transactions.parquet"]
    assert len(read_topic(kafka_config, kafka_config.transactions_topic)) == len(sim.transactions)
    # --publish sends only the reports made by the window's end (later ones belong to later windows).
    reported_by_end = int((sim.labels["reported_at"] < "2026-05-02").sum())
    assert len(read_topic(kafka_config, kafka_config.labels_topic)) == reported_by_end


def test_simulate_cli_needs_an_output(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["simulate", "--days", "1"])
    assert result.exit_code == 2
    assert "--out DIR, --publish, or both" in result.output
