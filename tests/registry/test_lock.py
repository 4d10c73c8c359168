"""The registry lock on a real MLflow SQLite store: exclusion between processes, no lost update,
independent names, holders that crash or freeze; and the same through a real tracking server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipeline.kafka.broker import free_port
from pipeline.registry.errors import LockTimeout
from pipeline.registry.lock import LOCK_MODEL, NAME_TAG, RegistryLock

ROOT = Path(__file__).parents[2]
# Long enough that a holder's heartbeat (every lease / 4) never stalls for a whole lease on a loaded
# machine, short enough that the tests which wait one lease out stay quick.
LEASE_S = 5.0


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = f"sqlite:///{tmp_path_factory.mktemp('lock-store') / 'mlflow.db'}"
    client(uri).search_experiments()  # create the schema before processes race to
    return uri


def client(uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def live_tickets(uri: str, name: str) -> list[int]:
    return [int(v.version) for v in client(uri).search_model_versions(f"name = '{LOCK_MODEL}'")
            if v.tags.get(NAME_TAG) == name]


def worker(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.registry.lock_worker", *args], cwd=ROOT, text=True,
                            **popen)


def test_a_second_holder_times_out_naming_the_first_and_leaves_no_ticket(store):
    first = RegistryLock(client(store), "model-a", timeout_s=5, lease_s=30)
    with first:
        with pytest.raises(LockTimeout, match=re.escape(first.owner)):
            RegistryLock(client(store), "model-a", timeout_s=0.5, lease_s=30).acquire()
        assert live_tickets(store, "model-a") == [first.ticket]
        first_ticket = first.ticket
        with RegistryLock(client(store), "model-b", timeout_s=0.5, lease_s=30):  # another model: independent
            pass
    with RegistryLock(client(store), "model-a", timeout_s=0.5, lease_s=30) as second:
        assert second.ticket > first_ticket  # numbers are never reused
        second.ensure_held()
    assert live_tickets(store, "model-a") == []


def test_heartbeats_keep_a_long_holder_alive(store):
    """Holding for several leases is fine while the holder's heartbeat reaches the store."""
    with RegistryLock(client(store), "model-long", timeout_s=5, lease_s=LEASE_S) as holder:
        with pytest.raises(LockTimeout):  # the waiter watches the holder's heartbeat for 2.5 leases
            RegistryLock(client(store), "model-long", timeout_s=2.5 * LEASE_S, lease_s=LEASE_S).acquire()
        holder.ensure_held()


@pytest.mark.slow
def test_two_processes_never_overlap_and_lose_no_update(store, tmp_path):
    """Each process does read-pause-write on a registered-model tag under the lock: any overlap
    would lose an update (the final count) and show as overlapping critical sections."""
    client(store).create_registered_model("counted", tags={"counter": "0"})
    log = tmp_path / "sections.log"
    procs = [worker("count", store, "counted", "10", str(log)) for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    assert client(store).get_registered_model("counted").tags["counter"] == "20"
    sections = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    assert len(sections) == 20
    assert all(start >= previous_end for (_, previous_end), (start, _) in zip(sections, sections[1:], strict=False))


@pytest.mark.slow
def test_a_killed_holder_blocks_the_next_one_for_one_lease_only(store):
    holder = worker("hold", store, "model-killed", str(LEASE_S), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == "held\n"
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    started = time.monotonic()
    with RegistryLock(client(store), "model-killed", timeout_s=6 * LEASE_S, lease_s=LEASE_S):
        waited = time.monotonic() - started
    # At least the lease: the dead ticket is broken only after its heartbeat stood still that long (the
    # waiter's own clock, started after `started`). Well under the timeout: broken, not waited out.
    assert LEASE_S <= waited < 4 * LEASE_S


@pytest.mark.slow
def test_a_frozen_holder_loses_the_lock_and_is_told_so(store):
    # The holder beats every 2 s, so it is stopped between store writes; the waiter presumes it dead
    # after 1.5 s of an unchanged heartbeat and takes the lock.
    holder = worker("hold", store, "model-frozen", "8", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == "held\n"
        os.kill(holder.pid, signal.SIGSTOP)
        try:
            with RegistryLock(client(store), "model-frozen", timeout_s=30, lease_s=1.5) as waiter:
                waiter.ensure_held()
        finally:
            os.kill(holder.pid, signal.SIGCONT)
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "lost\n"
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow server`` on a free loopback port (what conf/prod points at), stopped at the end."""
    root = tmp_path_factory.mktemp("mlflow-server")
    uri = f"http://127.0.0.1:{free_port()}"
    with (root / "server.log").open("w") as log:
        server = subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
             "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1",
             "--port", uri.rsplit(":", 1)[1], "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # its own group: workers stop with it
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, (root / "server.log").read_text()
                time.sleep(1)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


@pytest.mark.slow
def test_two_processes_through_a_tracking_server_lose_no_update(tracking_server, tmp_path):
    """The production path: the server validates each ticket like any model version and its
    database hands out the numbers."""
    client(tracking_server).create_registered_model("counted-remotely", tags={"counter": "0"})
    procs = [worker("count", tracking_server, "counted-remotely", "5", str(tmp_path / "sections.log"))
             for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    assert client(tracking_server).get_registered_model("counted-remotely").tags["counter"] == "10"
