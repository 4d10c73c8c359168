"""``fraudctl produce`` on a hostile file, against the real embedded broker: every line ends sent or
rejected with a reason; none ends the command in a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.kafka.reader import read_topic
from pipeline.kafka.settings import KafkaConfig
from pipeline.simulation import SimulationConfig, simulate
from tests.kafka.test_producer import write_conf

pytestmark = pytest.mark.broker

TINY = SimulationConfig(seed=5, start_date="2026-02-01", days=1, num_cards=200, num_merchants=150)


def test_hostile_lines_become_rejects_and_the_valid_ones_are_sent(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    good = list(simulate(TINY).transaction_records())[:3]
    open_tx = json.dumps(good[0])[:-1]
    hostile = [
        b"[" * 10_000 + b"]" * 10_000,  # the RecursionError traceback this command used to end in
        b"\xff\xfe not UTF-8",
        b"[1, 2]",
        b"3.5",
        f'{open_tx}, "extra": {"7" * 5000}}}'.encode(),
        f'{open_tx}, "score": NaN}}'.encode(),
    ]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join([json.dumps(good[0]).encode(), *hostile, *(json.dumps(r).encode() for r in good[1:])]))

    result = CliRunner().invoke(cli, ["produce", "--file", str(path)],
                                env={"FRAUD_CONF_DIR": str(write_conf(tmp_path / "conf", kafka_config))})

    assert result.exit_code == 0, result.output
    assert "rejected: malformed_json 4, not_an_object 2" in result.output
    rejects = [json.loads(line) for line in (tmp_path / "events.jsonl.rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [
        (2, "malformed_json"), (3, "malformed_json"), (4, "not_an_object"), (5, "not_an_object"),
        (6, "malformed_json"), (7, "malformed_json")]
    sent = read_topic(kafka_config, kafka_config.transactions_topic)
    assert sorted(json.loads(r.value)["transaction_id"] for r in sent) == sorted(r["transaction_id"] for r in good)
