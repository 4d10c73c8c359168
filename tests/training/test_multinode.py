"""Two torchrun agents on one machine as two nodes: c10d rendezvous, one gloo process per node.

The reference is one node x 2 processes on the same config and seeds; the two-node runs must end
with the same bytes in every tensor of the final checkpoint (model, weight average, optimizer,
each rank's error-feedback residuals and RNG state). Node 1 is then lost mid-run the way a node
goes: its agent SIGKILLed, and its worker with it (a container's or Slurm step's processes die
with their agent; on a bare machine torchrun starts workers in their own session, so the test
kills the worker itself). The scheduler's part, starting node 1's agent again, is the test's.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.config import PROJECT_ROOT
from pipeline.training.checkpoint import TRAINER_FILE, load_tensor_file, rank_file
from pipeline.training.launch import Torchrun, agent_command, agent_environment, run_training
from pipeline.training.run_dir import RunDir
from tests.training.dataset_factory import write_conf_dir

pytestmark = pytest.mark.slow

# 2 ranks x 2 micro-batches of 64 rows: 9 steps per epoch, 18 in all; checkpoints every 4 steps.
JOB = {"optim": {"accumulation_steps": 2}}
TOTAL_STEPS = 18
AGENT_TIMEOUT_S = 240  # rendezvous and a tiny run take ~30 s on 2 shared cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (a torchrun agent's workers), from /proc."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _kill_node(agent: subprocess.Popen) -> None:
    """SIGKILL an agent and its workers (what losing the node does to them)."""
    workers = _children(agent.pid)
    agent.kill()
    agent.wait()
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class TwoNodes:
    """Node agents for one run, started like ``fraudctl train --nnodes 2 --nproc 1`` on each node."""

    def __init__(self, run_dir: Path, conf: Path, dataset: Path, logs: Path):
        self.run_dir, self.conf, self.dataset, self.logs = run_dir, conf, dataset, logs
        self.port = _free_port()
        self.torchrun = Torchrun(nproc_per_node=1, nnodes=2, rdzv_endpoint=f"127.0.0.1:{self.port}", max_restarts=1)
        self.agents: list[subprocess.Popen] = []

    def start(self, name: str) -> subprocess.Popen:
        command = agent_command(self.torchrun, self.run_dir, config_path=self.conf, dataset_root=self.dataset)
        with (self.logs / f"{name}.log").open("w") as log:
            agent = subprocess.Popen(command, cwd=PROJECT_ROOT, env=agent_environment(self.torchrun), stdout=log,
                                     stderr=subprocess.STDOUT)
        self.agents.append(agent)
        return agent

    def start_both(self) -> tuple[subprocess.Popen, subprocess.Popen]:
        # Both agents see 127.0.0.1 as their own host and would race to host the rendezvous; node 0
        # first, as on a cluster where only node 0 owns the endpoint, so node 1 is the one we may lose.
        node0 = self.start("node0")
        _wait_until(lambda: _listening(self.port), node0, "node 0's agent to host the rendezvous")
        return node0, self.start("node1")

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()

    def stop_all(self) -> None:
        for agent in self.agents:
            if agent.poll() is None:
                _kill_node(agent)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_until(condition, agent: subprocess.Popen, what: str, timeout_s: float = AGENT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert agent.poll() is None, f"agent exited with {agent.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _flatten(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _flatten(value, f"{prefix}/{key}")
    elif isinstance(obj, list | tuple):
        for i, value in enumerate(obj):
            yield from _flatten(value, f"{prefix}[{i}]")
    else:
        yield prefix, obj


def _assert_final_checkpoints_identical(a: Path, b: Path) -> None:
    """Every leaf of trainer.pt and of both ranks' files in the last step checkpoint, bit for bit."""
    final = Path("checkpoints") / f"step-{TOTAL_STEPS:08d}"
    for name in (TRAINER_FILE, rank_file(0), rank_file(1)):
        leaves_a = dict(_flatten(load_tensor_file(a / final / name)))
        leaves_b = dict(_flatten(load_tensor_file(b / final / name)))
        assert leaves_a.keys() == leaves_b.keys(), name
        tensors = [k for k, v in leaves_a.items() if isinstance(v, torch.Tensor)]
        assert len(tensors) >= 3, f"{name}: expected tensors to compare, got {sorted(leaves_a)}"
        for key, value in leaves_a.items():
            other = leaves_b[key]
            same = torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other
            assert same, f"{name}{key} differs between {a.name} and {b.name}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("multinode")


@pytest.fixture(scope="module")
def conf(workdir: Path) -> Path:
    return write_conf_dir(workdir / "conf", JOB) / "train.toml"


@pytest.fixture(scope="module")
def one_node(workdir: Path, conf: Path, tiny_dataset: Path) -> Path:
    """The reference: 1 node x 2 processes."""
    run_dir = workdir / "one-node"
    run_training(None, run_dir, tiny_dataset, Torchrun(nproc_per_node=2), config_path=conf,
                 log_file=workdir / "one-node.log", timeout_s=AGENT_TIMEOUT_S)
    return run_dir


@pytest.fixture
def nodes(workdir: Path, conf: Path, tiny_dataset: Path, request) -> Iterator[TwoNodes]:
    run_dir = workdir / request.node.name
    logs = workdir / f"{request.node.name}-logs"
    logs.mkdir()
    two = TwoNodes(run_dir, conf, tiny_dataset, logs)
    try:
        yield two
    finally:
        two.stop_all()


def test_two_nodes_end_bit_identical_to_one_node_with_two_processes(one_node, nodes):
    node0, node1 = nodes.start_both()
    assert [node0.wait(AGENT_TIMEOUT_S), node1.wait(AGENT_TIMEOUT_S)] == [0, 0], nodes.log("node0") + nodes.log("node1")
    summary = RunDir(nodes.run_dir).read_summary()
    assert summary is not None and summary.completed and summary.global_step == TOTAL_STEPS
    # One process per agent, yet one world of two: the two agents formed one job.
    assert "2 x gloo" in nodes.log("node0") + nodes.log("node1")
    _assert_final_checkpoints_identical(one_node, nodes.run_dir)


def test_losing_node_1_restarts_the_round_and_resumes_from_the_last_checkpoint(one_node, nodes):
    node0, node1 = nodes.start_both()
    first = nodes.run_dir / "checkpoints" / "step-00000004"
    _wait_until(first.exists, node0, "the first checkpoint")
    assert not (nodes.run_dir / "summary.json").exists()
    _kill_node(node1)
    # Node 0's worker loses its peer and fails; its agent spends one of --max-restarts and waits in
    # the rendezvous for two nodes again, which node 1's new agent (same command) completes.
    node1_again = nodes.start("node1-again")
    assert [node0.wait(AGENT_TIMEOUT_S), node1_again.wait(AGENT_TIMEOUT_S)] == [0, 0], (
        nodes.log("node0") + nodes.log("node1-again"))

    output = nodes.log("node0") + nodes.log("node1-again")
    resumed = re.findall(r"resumed from \S+step-(\d{8}) \(step (\d+),", output)
    assert resumed, f"no resume in the logs:\n{output[-3000:]}"
    assert int(resumed[-1][0]) == int(resumed[-1][1]) >= 4, resumed
    assert f"resuming at step {int(resumed[-1][1])}" in output
    summary = RunDir(nodes.run_dir).read_summary()
    assert summary is not None and summary.completed and summary.global_step == TOTAL_STEPS
    assert [s["step"] for s in RunDir(nodes.run_dir).read_steps()] == list(range(1, TOTAL_STEPS + 1))
    _assert_final_checkpoints_identical(one_node, nodes.run_dir)
