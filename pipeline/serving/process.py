"""One way to run a scoring server as a child process, wait until it answers, and stop it.

The demo, the scoring bench and the tests all start ``fraudctl serve`` (the bench also
``mlflow models serve``) beside themselves on a free loopback port and poll it until it is ready.
:class:`ServerProcess` is that, once:

* the child runs in its own process group (``mlflow models serve`` forks uvicorn), logging stdout
  and stderr to one file; stopping sends the group SIGTERM (uvicorn drains, the service stops its
  threads), then SIGKILL after a grace period, and returns the exit code;
* :meth:`ServerProcess.wait_until` polls one path until a predicate on the response holds; a
  child that exits, or a deadline that passes, raises :class:`ServiceFailed` naming the log and
  quoting its end, so whoever started it sees why.

Servers started here listen on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from pipeline.config import PROJECT_ROOT
from pipeline.kafka.broker import free_port

HOST = "127.0.0.1"
FRAUDCTL = "from pipeline.cli.main import cli; cli()"  # `fraudctl`, from this interpreter's environment
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.25
LOG_TAIL_CHARS = 3000  # of the child's log, quoted when it fails

Ready = Callable[[httpx.Response], bool]


class ServiceFailed(RuntimeError):
    """A server did not start, answer or reload; the message points at its log."""


def serve_command(port: int, *, env: str | None = None, options: Sequence[str] = ()) -> list[str]:
    """``fraudctl [--env ENV] serve --host 127.0.0.1 --port PORT [options]`` in this interpreter."""
    chosen = ["--env", env] if env else []
    return [sys.executable, "-c", FRAUDCTL, *chosen, "serve", "--host", HOST, "--port", str(port), *options]


def status_ok(response: httpx.Response) -> bool:
    return response.status_code == 200


class ServerProcess:
    """A server as a child process on ``port`` of 127.0.0.1; ``with`` stops it on the way out."""

    def __init__(self, command: Sequence[str], environment: Mapping[str, str], log: Path, port: int) -> None:
        self.command, self.environment, self.log, self.port = list(command), dict(environment), log, port
        self.url = f"http://{HOST}:{port}"
        self.process: subprocess.Popen | None = None

    @classmethod
    def fraudctl_serve(cls, environment: Mapping[str, str], log: Path, *, env: str | None = None,
                       options: Sequence[str] = ()) -> ServerProcess:
        """``fraudctl serve`` on a free port (not started yet)."""
        port = free_port(HOST)
        return cls(serve_command(port, env=env, options=options), environment, log, port)

    def start(self) -> ServerProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:  # the child keeps its own descriptor
            self.process = subprocess.Popen(self.command, cwd=PROJECT_ROOT, env=self.environment, stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def wait_until(self, path: str = "/ready", ready: Ready = status_ok, timeout_s: float = 180.0) -> httpx.Response:
        """Poll ``path`` until ``ready(response)``; the response that satisfied it."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=5.0) as http:
            while time.monotonic() < deadline:
                self.check_alive()
                try:
                    response = http.get(path)
                    if ready(response):
                        return response
                except httpx.TransportError:
                    pass  # not listening yet
                time.sleep(POLL_INTERVAL_S)
        raise self._failure(f"{self.url}{path} was not ready after {timeout_s:.0f}s")

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise self._failure(f"{self._name()} exited with code {self.process.returncode}")

    def stop(self) -> int | None:
        """SIGTERM to the process group, SIGKILL after STOP_TIMEOUT_S; the exit code (None if never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT_S)
        return self.process.returncode

    def __enter__(self) -> ServerProcess:
        return self if self.process is not None else self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass  # the group ended between the poll and the signal

    def _name(self) -> str:
        return "the scoring service" if "serve" in self.command and FRAUDCTL in self.command else self.command[0]

    def _failure(self, what: str) -> ServiceFailed:
        tail = self.log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if self.log.exists() else ""
        return ServiceFailed(f"{what}: see {self.log}" + (f"\n{tail}" if tail else ""))
