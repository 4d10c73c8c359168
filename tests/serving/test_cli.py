"""``fraudctl serve`` as a real process, and ``fraudctl consistency``'s exit codes."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import httpx
import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.registry.store import CHAMPION, connect
from pipeline.serving.config import ADMIN_TOKEN_ENV
from pipeline.serving.process import ServerProcess
from tests.serving import factory


@pytest.mark.slow
def test_serve_runs_until_sigterm_and_answers_on_loopback(config, logged, tmp_path):
    dev = replace(config, model_name="fraud-detector")  # the name conf/dev/registry.toml serves
    version = factory.register(dev, logged.good)
    connect(dev).set_registered_model_alias(dev.model_name, CHAMPION, str(version))
    env = {**os.environ, ADMIN_TOKEN_ENV: "", "FRAUD_ENV": "dev"}
    with ServerProcess.fraudctl_serve(env, tmp_path / "serve.log", options=["--no-kafka"]) as server:
        server.wait_until("/ready", timeout_s=120)
        assert httpx.get(f"{server.url}/health").json()["model"]["version"] == version
        # uvicorn drains, runs the lifespan shutdown (the service stops), then re-raises the signal.
        assert server.stop() == -signal.SIGTERM
    assert "Application shutdown complete" in (tmp_path / "serve.log").read_text()


def test_serve_refuses_an_invalid_port():
    result = CliRunner().invoke(cli, ["serve", "--port", "70000"])
    assert result.exit_code == 2


@pytest.mark.broker
def test_consistency_exits_1_when_nothing_was_scored(kafka_config, monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_config.bootstrap_servers)
    from pipeline.kafka.admin import create_topics

    create_topics(kafka_config, ("scores",), 1)
    result = CliRunner().invoke(cli, ["consistency", "--date", "2026-03-07"])
    assert result.exit_code == 1 and "no decisions for payments of 2026-03-07" in result.output
    assert CliRunner().invoke(cli, ["consistency", "--date", "2026-02-30"]).exit_code == 2
