"""Concurrent gates in separate processes (``fraudctl promote``, as the DAG runs it) and the lock they
share through the MLflow store (the lock itself: test_lock.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.registry.audit import read_history
from pipeline.registry.config import load_registry_config
from pipeline.registry.errors import LockTimeout
from pipeline.registry.lock import LOCK_MODEL, NAME_TAG, registry_lock
from pipeline.registry.promotion import run_gate
from pipeline.registry.store import CHAMPION, connect, version_by_alias
from pipeline.registry.tracking import register_run

FRAUDCTL = str(Path(sys.executable).parent / "fraudctl")


def start_gate(world, conf_dir: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "FRAUD_STATE_DIR": str(world.state)}
    if conf_dir is not None:
        env["FRAUD_CONF_DIR"] = str(conf_dir)
    return subprocess.Popen([FRAUDCTL, "promote", "--json"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, dict | str]:
    out, err = proc.communicate(timeout=300)
    try:
        return proc.returncode, json.loads(out)
    except json.JSONDecodeError:
        return proc.returncode, err


def wait_for_queued_gates(client, model_name: str, gates: list[subprocess.Popen], timeout_s: float = 240):
    """Until every gate has drawn its lock ticket (``pipeline.registry.lock``: one per waiter)."""
    deadline = time.monotonic() + timeout_s
    while True:
        versions = client.search_model_versions(f"name = '{LOCK_MODEL}'")
        tickets = [v for v in versions if v.tags.get(NAME_TAG) == model_name]
        if len(tickets) > len(gates):  # the test's own ticket and one per gate
            return
        exited = [g.returncode for g in gates if g.poll() is not None]
        assert not exited and time.monotonic() < deadline, f"{len(tickets)} lock tickets; gates exited: {exited}"
        time.sleep(0.2)


@pytest.fixture
def dev_config():
    return load_registry_config("dev")  # what the fraudctl processes read: model "fraud-detector"


@pytest.mark.slow
def test_two_concurrent_gates_promote_once(world, dev_config):
    client = connect(dev_config)
    version = register_run(world.run_dir("concurrent-first", world.good), dev_config)
    # Both gates start while the test holds the lock, and it is released only once both are queued
    # for it: their attempts truly overlap, however the two processes happen to be scheduled.
    with registry_lock(dev_config):
        gates = [start_gate(world), start_gate(world)]
        try:
            wait_for_queued_gates(client, dev_config.model_name, gates)
        except BaseException:
            for gate in gates:
                gate.kill()
                gate.wait()
            raise
    results = [finish(p) for p in gates]
    assert [code for code, _ in results] == [0, 0], results
    assert sorted(report["outcome"] for _, report in results) == ["already-champion", "promoted"]
    assert int(version_by_alias(client, dev_config.model_name, CHAMPION).version) == version
    assert [(r.action, r.to_version) for r in read_history(client, dev_config.model_name)] == [("promote", version)]


@pytest.mark.slow
def test_a_gate_waits_for_the_lock_and_gives_up_with_exit_1(world, tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    text = (Path(__file__).parents[2] / "conf" / "dev" / "registry.toml").read_text()
    (conf / "registry.toml").write_text(text.replace("lock_timeout_s = 600.0", "lock_timeout_s = 1.0"))
    config = load_registry_config(path=conf / "registry.toml")
    assert config.lock_timeout_s == 1.0
    client = connect(config)
    register_run(world.run_dir("locked-out", world.good), config)
    champion_before = version_by_alias(client, config.model_name, CHAMPION)
    with registry_lock(config) as held:
        code, err = finish(start_gate(world, conf))
    assert code == 1 and "LockTimeout" in err and "registry lock" in err and held.owner in err
    assert version_by_alias(client, config.model_name, CHAMPION) == champion_before


def test_gate_in_process_honours_a_held_lock(world, config):
    register_run(world.run_dir(f"{config.model_name}-held", world.good), config)
    quick = replace(config, lock_timeout_s=0.3)
    with registry_lock(quick):
        with pytest.raises(LockTimeout):
            run_gate(quick)
    assert run_gate(quick).outcome == "promoted"
