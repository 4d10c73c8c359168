"""``fraudctl simulate --publish`` over consecutive windows, against the real embedded broker: each
window publishes the labels reported by its end, and a later window the ones reported during it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.cli.simulate import FILE_FORMATS
from pipeline.config import load_section
from pipeline.kafka.reader import read_topic
from pipeline.kafka.settings import KafkaConfig
from pipeline.simulation import Simulation, SimulationConfig, simulate
from pipeline.simulation.io import EVENT_FORMATS
from tests.kafka.test_producer import write_conf

OPTIONS = {"days": 2, "num_cards": 800, "seed": 4, "fraud_rate": 0.03}
ARGS = ["--days", "2", "--cards", "800", "--seed", "4", "--fraud-rate", "0.03"]
FIRST, SECOND, END = "2026-05-01", "2026-05-03", "2026-05-05"  # two 2-day windows and the second one's end


def fraudctl(conf: Path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["simulate", *ARGS, *args], env={"FRAUD_CONF_DIR": str(conf)})
    assert result.exit_code == 0, result.output
    return result.output


def labels(records) -> list[tuple[str, str, bool]]:
    return sorted((r["transaction_id"], r["reported_at"], r["is_fraud"]) for r in records)


def published(kafka: KafkaConfig) -> list[tuple[str, str, bool]]:
    return labels(json.loads(r.value) for r in read_topic(kafka, kafka.labels_topic))


def window(conf: Path, start: str) -> Simulation:
    config = load_section(SimulationConfig, "simulation", path=conf / "simulation.toml")
    return simulate(dataclasses.replace(config, start_date=start, **OPTIONS))


@pytest.mark.broker
def test_consecutive_windows_publish_each_label_once_in_the_window_it_is_reported(
        kafka_config: KafkaConfig, tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "conf", kafka_config)
    first, second = labels(window(conf, FIRST).label_records()), labels(window(conf, SECOND).label_records())
    # The cut only shows if the first window's reports fall in all three periods: its own, the next, later.
    assert {(r < SECOND, r < END) for _, r, _ in first} == {(True, True), (False, True), (False, False)}

    fraudctl(conf, "--start-date", FIRST, "--publish")
    after_first = published(kafka_config)
    assert after_first == [label for label in first if label[1] < SECOND]

    out = fraudctl(conf, "--start-date", SECOND, "--publish", "--since", FIRST)
    after_second = published(kafka_config)
    assert after_second == sorted(label for label in first + second if label[1] < END)
    assert f"publishing {len(after_second) - len(after_first)} labels" in out


@pytest.mark.parametrize("args, message", [
    (["--start-date", SECOND, "--publish", "--since", "2026-05-02"], "whole number of 2-day windows"),
    (["--start-date", FIRST, "--publish", "--since", SECOND], "whole number of 2-day windows"),
    (["--start-date", SECOND, "--out", "x", "--since", FIRST], "--since only matters with --publish"),
    (["--start-date", "2026-05-32", "--out", "x"], "not a date"),
    (["--cards", "5", "--out", "x"], "num_cards must be >= 100"),
], ids=["misaligned", "since-after-start", "since-without-publish", "bad-date", "config-rejects-option"])
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["simulate", "--days", "2", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_the_format_choice_is_the_event_file_formats() -> None:
    assert FILE_FORMATS == EVENT_FORMATS


def test_preset_selects_the_second_portfolio_and_an_unknown_one_exits_1(tmp_path: Path) -> None:
    runner = CliRunner()
    default = runner.invoke(cli, ["simulate", "--days", "1", "--cards", "200", "--out", str(tmp_path / "a")])
    preset = runner.invoke(cli, ["simulate", "--days", "1", "--cards", "200", "--preset", "ecommerce",
                                 "--out", str(tmp_path / "b")])
    assert default.exit_code == 0 and preset.exit_code == 0, default.output + preset.output
    # The preset's own seed is 4242 (conf/dev/simulation.ecommerce.toml); the default's is 7.
    assert "seed 4242" in preset.output and "seed 7" in default.output
    assert (tmp_path / "a" / "transactions.jsonl").read_text() != (tmp_path / "b" / "transactions.jsonl").read_text()
    unknown = runner.invoke(cli, ["simulate", "--days", "1", "--preset", "retial", "--out", str(tmp_path / "c")])
    assert unknown.exit_code == 1
    assert "simulation preset 'retial'" in unknown.output and "ecommerce" in unknown.output
