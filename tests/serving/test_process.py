"""A server as a child process: started, waited for, reported with its log when it fails, stopped
with its whole process group."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from pipeline.serving.process import FRAUDCTL, ServerProcess, ServiceFailed, serve_command

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"]


def _alive(pid: int) -> bool:
    """Running, not gone and not a zombie waiting for whoever adopted it to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_serve_command_runs_fraudctl_serve_on_loopback_in_this_interpreter():
    assert serve_command(8123, env="prod", options=["--no-kafka"]) == [
        sys.executable, "-c", FRAUDCTL, "--env", "prod", "serve", "--host", "127.0.0.1", "--port", "8123", "--no-kafka"]
    assert "--env" not in serve_command(8123)


def test_a_service_that_exits_is_reported_with_its_log(tmp_path, state_dir):
    service = ServerProcess.fraudctl_serve(dict(os.environ), tmp_path / "serving.log", env="no-such-env")
    assert service.url == f"http://127.0.0.1:{service.port}"
    service.start()
    try:
        with pytest.raises(ServiceFailed, match=r"the scoring service exited with code 1: see .*serving\.log\n"
                                                r"(?s:.*)no-such-env"):
            service.wait_until("/ready", timeout_s=120)
    finally:
        assert service.stop() == 1


def test_a_server_that_never_answers_times_out_and_stop_ends_it(tmp_path):
    log = tmp_path / "sleeper.log"
    with ServerProcess(SLEEPER, dict(os.environ), log, port=9) as server:
        # The child's "up" must be in the log before the 1 s wait starts: on a loaded machine the
        # interpreter alone can take longer than that to start, and the message must carry the log.
        assert wait_for(lambda: log.exists() and "up" in log.read_text().split()), "the sleeper never started"
        with pytest.raises(ServiceFailed, match=r"http://127\.0\.0\.1:9/ready was not ready after 1s: see .*\nup"):
            server.wait_until("/ready", timeout_s=1)
        assert server.process.poll() is None
    assert server.process.returncode == -signal.SIGTERM


def wait_for(condition, timeout_s: float = 60.0) -> bool:
    """True once ``condition()`` holds; False after ``timeout_s`` (generous: a loaded 2-core machine)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_stop_ends_the_whole_process_group(tmp_path):
    # mlflow models serve forks uvicorn: the child's own children must not outlive it.
    command = ["bash", "-c", f"sleep 120 & echo $! > {tmp_path}/child.pid; wait"]
    server = ServerProcess(command, dict(os.environ), tmp_path / "group.log", port=9).start()
    deadline = time.monotonic() + 10
    while not (tmp_path / "child.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int((tmp_path / "child.pid").read_text())
    assert _alive(child)
    assert server.stop() is not None
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_stop_before_start_is_nothing():
    assert ServerProcess(SLEEPER, {}, Path("unused.log"), port=9).stop() is None
