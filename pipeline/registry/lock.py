"""Serialise promotions and rollbacks: two gate runs at once must not interleave their alias moves.

Interface: ``with registry_lock(config): ...`` -- a context manager that holds an exclusive lock for
the registered model or raises LockTimeout after ``config.lock_timeout_s``.

Implementation: an ``fcntl.flock`` on a file next to the embedded SQLite store. The kernel drops the
lock when the holder exits or is killed, so a crashed gate never leaves the registry locked. This
only serialises processes on one host sharing that filesystem -- exactly the embedded store's
case. With a remote tracking server used from several hosts the lock must be shared by all of them
(e.g. a PostgreSQL advisory lock, ``pg_advisory_lock(hashtext('<model name>'))``, on the server's
backing database); replace :func:`registry_lock` with such an implementation of the same interface.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.registry.config import RegistryConfig, local_store_dir
from pipeline.registry.errors import LockTimeout

POLL_S = 0.1


class FileLock:
    """Exclusive ``flock`` on ``path``; reentrant use in one process is not supported."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self._holder(fd)
                    os.close(fd)
                    raise LockTimeout(
                        f"registry lock {self.path} is held by {holder or 'another process'} for more than "
                        f"{self.timeout_s:.0f}s; wait for that promotion/rollback to finish, then retry"
                    ) from None
                time.sleep(POLL_S)
        # Who holds it, for the message above in the next waiter; informational only.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            return os.pread(fd, 200, 0).decode(errors="replace").strip()
        except OSError:
            return ""

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_path(config: RegistryConfig) -> Path:
    return local_store_dir(config) / "locks" / f"{config.model_name}.lock"


@contextlib.contextmanager
def registry_lock(config: RegistryConfig) -> Iterator[None]:
    """Hold the promotion lock of ``config.model_name`` for the duration of the block."""
    with FileLock(lock_path(config), config.lock_timeout_s):
        yield
