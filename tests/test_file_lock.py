"""The file lock: held against another process and another open of the file, waited for when blocking."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from pipeline.config import PROJECT_ROOT
from pipeline.file_lock import LockHeld, file_lock

# Holds the lock until its stdin closes; says "held" once it does.
HOLDER = """
import sys
from pipeline.file_lock import file_lock
with file_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


class Busy(LockHeld):
    pass


def test_a_second_open_of_the_file_cannot_take_a_held_lock(tmp_path):
    path = tmp_path / "state" / "lock"
    with file_lock(path):
        with pytest.raises(LockHeld, match=rf"held by pid {os.getpid()} on .*; wait for it to finish"):
            with file_lock(path):
                pass
    with file_lock(path):  # released on leaving the block
        pass
    assert path.read_text() == ""  # the holder's line goes with the lock


def test_another_process_cannot_take_it_and_the_error_is_the_callers(tmp_path):
    path = tmp_path / "lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], cwd=PROJECT_ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Busy, match=rf"another run is using it \(lock {path}, held by pid {holder.pid} "):
            with file_lock(path, error=Busy, user="another run is using it"):
                pass
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    with file_lock(path):  # the holder is gone
        pass


def test_blocking_waits_until_the_holder_releases(tmp_path):
    path = tmp_path / "lock"
    taken = threading.Event()

    def wait_for_lock():
        with file_lock(path, blocking=True):
            taken.set()

    with file_lock(path):
        waiter = threading.Thread(target=wait_for_lock)
        waiter.start()
        assert not taken.wait(0.5)  # still waiting while held
    assert taken.wait(30)
    waiter.join(30)
