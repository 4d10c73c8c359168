"""One writer at a time on this host: an exclusive ``flock`` on a lock file, as a context manager.

``with file_lock(path): ...`` holds ``path`` exclusively for the block. Non-blocking (the default)
raises ``error`` (a :class:`LockHeld`, or the caller's subclass) at once when someone else holds
it; ``blocking=True`` waits until they release it. The holder writes who it is (pid, host, start
time, command line) into the file, so the error names the process to wait for, and empties it on
release.

Guarantees and limits:

* the OS releases the lock when the holder's process dies, even killed with -9: there is never a
  stale lock to delete by hand;
* the lock belongs to the open file description, so a second ``open`` in the same process (another
  thread) waits or fails like another process would; the descriptor is close-on-exec, so programs
  the holder starts (Spark, a broker) do not hold it, but a child forked without exec does;
* host-local: processes on other hosts, even sharing the file over NFS, are not excluded. The model
  registry's lock needs that and is built otherwise (:mod:`pipeline.registry.lock`).
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

_HOLDER_BYTES = 1024  # what is read of a holder's line; longer command lines are cut when written


class LockHeld(RuntimeError):
    """Someone else holds the lock file; the message names them (see :func:`file_lock`)."""


@contextmanager
def file_lock(path: Path, *, blocking: bool = False, error: type[LockHeld] = LockHeld,
              user: str = "another process is using it") -> Iterator[None]:
    """Hold ``path`` (created with its parent if missing) exclusively for the block.

    Non-blocking: raises ``error("<user> (lock <path>, held by <holder>); wait for it to finish")``
    when it is held; ``user`` says who that is in the operator's terms ("another ingest run is using
    /data/raw"). ``blocking``: waits as long as it takes.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # not "w": that would erase the holder's line
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            raise error(f"{user} (lock {path}, {read_holder(fd)}); wait for it to finish") from None
        _write_holder(fd)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # still held here: the next holder never reads a stale line
    finally:
        os.close(fd)


def read_holder(fd: int) -> str:
    """The holder's line in the lock file open as ``fd``, or what to make of its absence."""
    line = os.pread(fd, _HOLDER_BYTES, 0).decode(errors="replace").strip()
    return f"held by {line}" if line else "its holder has not written its name yet"


def _write_holder(fd: int) -> None:
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = f"pid {os.getpid()} on {socket.gethostname()} since {since}: {' '.join(sys.argv)}"
    os.ftruncate(fd, 0)
    os.pwrite(fd, line.encode()[:_HOLDER_BYTES - 1] + b"\n", 0)
