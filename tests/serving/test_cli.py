"""``fraudctl serve`` as a real process, and ``fraudctl consistency``'s exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.config import PROJECT_ROOT
from pipeline.kafka.broker import free_port
from pipeline.registry.store import CHAMPION, connect
from pipeline.serving.config import ADMIN_TOKEN_ENV
from tests.serving import factory

FRAUDCTL = "from pipeline.cli.main import cli; cli()"


@pytest.mark.slow
def test_serve_runs_until_sigterm_and_answers_on_loopback(config, logged):
    dev = replace(config, model_name="fraud-detector")  # the name conf/dev/registry.toml serves
    version = factory.register(dev, logged.good)
    connect(dev).set_registered_model_alias(dev.model_name, CHAMPION, str(version))
    port = free_port()
    env = {**os.environ, ADMIN_TOKEN_ENV: "", "FRAUD_ENV": "dev"}
    proc = subprocess.Popen([sys.executable, "-c", FRAUDCTL, "serve", "--port", str(port), "--no-kafka"],
                            cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        ready = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert ready is not None and ready.status_code == 200, proc.stdout.read() if proc.poll() is not None else ""
        assert httpx.get(f"http://127.0.0.1:{port}/health").json()["model"]["version"] == version
        proc.send_signal(signal.SIGTERM)
        # uvicorn drains, runs the lifespan shutdown (the service stops), then re-raises the signal.
        assert proc.wait(60) == -signal.SIGTERM
        assert "Application shutdown complete" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


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
