"""Airflow deployed as README's "Running on real infrastructure" says, for the DAG tests: the
README's one-host block (its exports and its ``airflow`` commands, read from README.md), run
against the session's AIRFLOW_HOME (conftest.py) and the story's config and state directories.

What the test changes in that block: AIRFLOW_HOME and the pipeline's directories are the
session's, PATH leads to this interpreter's bin/ (the README's .venv when run as `make test`
does), port 8080 is a free one, ``airflow db migrate`` is the airflow_home fixture's, and four
settings spare the two CPU cores (one API worker, two task slots, one parsing process, no re-parsing).

``Deployment`` starts the block's long-running components (``api-server``, ``scheduler``,
``dag-processor``), each in a session of its own so that stopping it (by its pid) also stops what
it started (API workers, LocalExecutor workers, the tasks' spark-submit and torchrun). The state of
runs and tasks is read from the metadata DB by ``dag_runner wait-run``; the task logs are the files
the scheduler's workers wrote under ``$AIRFLOW_HOME/logs``, as an operator reads them.
"""

from __future__ import annotations

import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import closing
from pathlib import Path
from typing import Any

import psutil

from pipeline.config import PROJECT_ROOT
from pipeline.kafka.broker import free_port
from tests.airflow.conftest import RunAirflow, airflow_env

AIRFLOW = str(Path(sys.executable).parent / "airflow")
STOP_GRACE_S = 30.0
LISTEN_SAMPLE_S = 1.0  # a Spark driver listens for the whole job (tens of seconds); psutil costs CPU
README_PORT = "8080"
ONE_HOST = "On one host, to try it"  # the README paragraph the block follows


def readme_one_host_block() -> tuple[dict[str, str], list[list[str]], list[list[str]]]:
    """README's one-host block: (its exports, its commands, its background ``&`` commands), with
    ``$PWD`` the project root and ``$VAR`` this environment's."""
    readme = (PROJECT_ROOT / "README.md").read_text()
    block = readme[readme.index("```bash", readme.index(ONE_HOST)) + len("```bash"):]
    block = block[:block.index("```")]
    exports: dict[str, str] = {}
    commands: list[list[str]] = []
    background: list[list[str]] = []
    for line in block.strip().splitlines():
        words = shlex.split(line, comments=True)
        words = [os.path.expandvars(w.replace("$PWD", str(PROJECT_ROOT))) for w in words]
        if words[0] == "export":
            exports.update(w.split("=", 1) for w in words[1:])
        elif words[-1] == "&":
            background.append(words[:-1])
        else:
            commands.append(words)
    return exports, commands, background


class Deployment:
    """The README's one-host Airflow on ``home``; ``env`` holds the pipeline's settings (they win)."""

    def __init__(self, home: Path, env: dict[str, str], run_airflow: RunAirflow) -> None:
        self.home, self.port = home, str(free_port())
        exports, self.commands, self.components = readme_one_host_block()
        for test_own in ("AIRFLOW_HOME", "PATH"):
            exports.pop(test_own)
        exports = {k: v.replace(f":{README_PORT}", f":{self.port}") for k, v in exports.items()}
        self.env = airflow_env(home, {
            **exports,
            **env,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        })
        self.run_airflow = run_airflow
        self.processes: dict[str, subprocess.Popen] = {}
        self.process_logs: list[Any] = []
        self.listening: dict[str, set[str]] = {}  # process name -> addresses it listened on
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch_listening, daemon=True)

    def cli(self, *args: str, timeout_s: float = 120) -> str:
        """``airflow ARGS`` as the README writes it; its output. Fails the test on a non-zero exit."""
        done = subprocess.run([AIRFLOW, *args], env=self.env, cwd=PROJECT_ROOT, capture_output=True, text=True,
                              timeout=timeout_s)
        assert done.returncode == 0, f"airflow {' '.join(args)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done.stdout

    def setup(self) -> None:
        """The block's one-off commands (``airflow db migrate`` is the airflow_home fixture's)."""
        for words in self.commands:
            assert words[0] == "airflow", words
            if words[1:3] != ["db", "migrate"]:
                self.cli(*words[1:])

    def start(self) -> None:
        """The block's background components, on this deployment's port."""
        for words in self.components:
            assert words[0] == "airflow", words
            args = [self.port if w == README_PORT else w for w in words[1:]]
            log = (self.home / f"{args[0]}.log").open("w")
            self.process_logs.append(log)
            self.processes[args[0]] = subprocess.Popen([AIRFLOW, *args], env=self.env, cwd=PROJECT_ROOT, stdout=log,
                                                       stderr=subprocess.STDOUT, start_new_session=True)
        assert set(self.processes) == {"api-server", "scheduler", "dag-processor"}, self.components
        self._watcher.start()
        self._wait_healthy()

    def _watch_listening(self) -> None:
        """Sample, until stopped, the TCP addresses every process of the deployment listens on:
        the components, their workers, the tasks and what those start (spark-submit's JVM, torchrun)."""
        while not self._stopping.wait(LISTEN_SAMPLE_S):
            for process in self.processes.values():
                try:
                    tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
                for member in tree:
                    try:
                        ips = {c.laddr.ip for c in member.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
                        if ips:
                            self.listening.setdefault(member.name(), set()).update(ips)
                    except psutil.NoSuchProcess:
                        pass

    def _wait_healthy(self, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.port}/api/v2/monitor/health"
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise AssertionError(f"the API server did not answer {url} within {timeout_s:.0f} s\n{self.logs()}")

    def check_alive(self) -> None:
        dead = {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}
        assert not dead, f"Airflow components exited: {dead}\n{self.logs()}"

    def wait_parsed(self, dag_id: str, timeout_s: float = 300) -> None:
        """Until the DAG processor has stored ``dag_id`` (unpause and trigger need it). Read with
        sqlite3: an Airflow process would spend seconds importing to ask this."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            with closing(sqlite3.connect(self.home / "airflow.db", timeout=30)) as db:
                if db.execute("SELECT 1 FROM serialized_dag WHERE dag_id = ?", (dag_id,)).fetchone():
                    return
            assert time.monotonic() < deadline, f"{dag_id} not parsed after {timeout_s:.0f} s\n{self.logs()}"
            time.sleep(1)

    def wait_run(self, dag_id: str, *, logical_date: str | None = None, run_type: str | None = None,
                 timeout_s: float = 900) -> tuple[dict[str, Any], str]:
        """The run's final state, task states, tries and XComs (dag_runner wait-run), and its task logs."""
        args = ["wait-run", dag_id, "--timeout", str(timeout_s)]
        args += ["--logical-date", logical_date] if logical_date else ["--run-type", run_type or "scheduled"]
        self.check_alive()
        result, _ = self.run_airflow(*args, env=self.env, timeout_s=timeout_s + 120)
        self.check_alive()
        return result, self.task_logs(dag_id, result["run_id"])

    def task_logs(self, dag_id: str, run_id: str) -> str:
        """Every attempt's log of the run's tasks, in task order of the files' names."""
        run_dir = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        return "\n".join(p.read_text(errors="replace") for p in sorted(run_dir.glob("task_id=*/attempt=*.log")))

    def output(self, name: str) -> str:
        """What component ``name`` (and the processes it started) wrote to stdout and stderr."""
        return (self.home / f"{name}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{self.output(name)[-3000:]}" for name in self.processes)

    def stop(self) -> None:
        """SIGTERM each component's session (by its pid), then SIGKILL what is left after the grace period."""
        self._stopping.set()
        if self._watcher.is_alive():
            self._watcher.join()
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)  # its workers too, if they outlived it
            except ProcessLookupError:
                pass
            process.wait()
        for log in self.process_logs:
            log.close()
