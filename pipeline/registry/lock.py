"""Serialise promotions and rollbacks: two gates at once must not interleave their alias moves,
whichever hosts they run on.

Interface: ``with registry_lock(config) as lock: ...`` holds an exclusive lock for the registered
model, or raises LockTimeout after ``config.lock_timeout_s``; ``lock.ensure_held()`` before acting
raises LockLost if the lease ran out meanwhile.

The lock lives in the registry's own store, so every process that can move an alias sees it: the
embedded SQLite file or the tracking server's database alike. A host-local ``flock`` cannot do
that, and a plain registered-model tag cannot either: tags are upserts (last writer wins), so
"write my id, read it back" still lets two writers both read their own id back. The one atomic
primitive the store offers through the MLflow API is the model-version counter: creating a version
commits number max+1 under the (name, version) primary key, so no two creators get the same number,
and a number is only handed out once every lower one is committed. The lock is a ticket queue
(Lamport's bakery) built on it:

* acquire: create a version of the registered model ``LOCK_MODEL`` tagged with the locked model's
  name and an owner: its version is the ticket; wait until no live ticket for the same name is
  lower (first come, first served);
* release: delete the ticket version (versions are soft-deleted, so numbers are never reused);
* crashes: every ticket holder rewrites a heartbeat tag every ``lease_s / 4``; a ticket whose
  heartbeat a waiter sees unchanged for ``lease_s`` of the waiter's own clock (so host clocks may
  disagree) is dead, and the waiter deletes it. A gate killed with -9 thus delays the next one by
  at most ``lease_s``.

Limit: a holder frozen longer than ``lease_s`` (host suspended) loses the lock without knowing until
it calls ``ensure_held``; MLflow offers no conditional write to fence a write already under way.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from pipeline.registry.config import RegistryConfig
from pipeline.registry.errors import LockTimeout, RegistryError
from pipeline.registry.store import connect, model_exists

LOCK_MODEL = "fraud-registry-locks"  # one per store; one version per lock acquisition, never a model
LOCK_SOURCE = "registry-lock:/tickets"  # a version needs a source; this one names no artifacts
NAME_TAG = "lock.name"
OWNER_TAG = "lock.owner"
HEARTBEAT_TAG = "lock.heartbeat"
POLL_S = 0.25


class LockLost(RegistryError):
    """The registry lock's lease lapsed while this process held it (it was frozen or cut off from the
    store for longer than ``lock_lease_s``); another gate may be running. Nothing more is written."""


@dataclass
class _Seen:
    heartbeat: str
    since: float  # waiter's monotonic clock when it first saw this heartbeat value


class RegistryLock:
    """Exclusive lock on ``name`` kept in the MLflow store behind ``client``; not reentrant."""

    def __init__(self, client: MlflowClient, name: str, timeout_s: float, lease_s: float) -> None:
        self.client = client
        self.name = name
        self.timeout_s = timeout_s
        self.lease_s = lease_s
        self.owner = f"pid {os.getpid()} on {socket.gethostname()} ({uuid.uuid4().hex[:8]})"
        self.ticket: int | None = None
        self._last_beat = 0.0  # monotonic time of the last heartbeat the store accepted
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None

    def acquire(self) -> None:
        _ensure_lock_model(self.client)
        version = self.client.create_model_version(
            LOCK_MODEL, LOCK_SOURCE, tags={NAME_TAG: self.name, OWNER_TAG: self.owner, HEARTBEAT_TAG: "0"},
            description=f"registry lock ticket of {self.name!r}, held by {self.owner}")
        self.ticket = int(version.version)
        self._last_beat = time.monotonic()
        self._stop.clear()
        self._beater = threading.Thread(target=self._beat, name=f"registry-lock-{self.ticket}", daemon=True)
        self._beater.start()
        try:
            self._wait_for_turn()
        except BaseException:
            self.release()
            raise

    def _wait_for_turn(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        seen: dict[int, _Seen] = {}
        while True:
            now = time.monotonic()
            waiting_for = []
            for version in self._live_tickets():
                number, beat = int(version.version), version.tags.get(HEARTBEAT_TAG, "")
                if number >= self.ticket:
                    continue
                if number not in seen or seen[number].heartbeat != beat:
                    seen[number] = _Seen(beat, now)
                if now - seen[number].since > self.lease_s:
                    self._break(version)
                else:
                    waiting_for.append(version)
            if not waiting_for:
                return
            if now >= deadline:
                holder = waiting_for[0]
                raise LockTimeout(
                    f"registry lock of {self.name!r} (ticket {holder.version} in {LOCK_MODEL!r}) is held by "
                    f"{holder.tags.get(OWNER_TAG, 'another process')} for more than {self.timeout_s:g}s; wait "
                    "for that promotion/rollback to finish, then retry")
            time.sleep(POLL_S)

    def _live_tickets(self) -> list[ModelVersion]:
        """Undeleted tickets for this lock's name, lowest first (deleted versions are not listed)."""
        versions = self.client.search_model_versions(f"name = '{LOCK_MODEL}'")
        return sorted((v for v in versions if v.tags.get(NAME_TAG) == self.name), key=lambda v: int(v.version))

    def _break(self, version: ModelVersion) -> None:
        """Delete the ticket of a holder whose heartbeat stopped (it crashed or was killed)."""
        with contextlib.suppress(MlflowException):  # another waiter broke it first
            self.client.delete_model_version(LOCK_MODEL, version.version)

    def _beat(self) -> None:
        count = 0
        while not self._stop.wait(self.lease_s / 4):
            count += 1
            try:
                self.client.set_model_version_tag(LOCK_MODEL, str(self.ticket), HEARTBEAT_TAG, str(count))
            except Exception:  # noqa: BLE001 -- store unreachable or ticket broken: ensure_held reports it
                continue
            self._last_beat = time.monotonic()

    def ensure_held(self) -> None:
        """Raise LockLost unless the ticket is still in the store and a heartbeat reached it within half
        a lease: then no waiter can presume this holder dead for at least another half lease."""
        silent = time.monotonic() - self._last_beat
        try:
            alive = self.ticket is not None and bool(self.client.get_model_version(LOCK_MODEL, str(self.ticket)))
        except MlflowException:
            alive = False  # deleted: a waiter presumed this holder dead
        if not alive or silent > self.lease_s / 2:
            raise LockLost(
                f"registry lock of {self.name!r} (ticket {self.ticket}) lost after {silent:.0f}s without a "
                f"heartbeat (lease {self.lease_s:.0f}s); another promotion/rollback may be running. Nothing more "
                "was written: check `fraudctl history` and the aliases, then re-run")

    def release(self) -> None:
        """Stop the heartbeat and delete the ticket; if the store is unreachable the lease expires instead."""
        self._stop.set()
        if self._beater is not None:
            self._beater.join()
            self._beater = None
        if self.ticket is not None:
            with contextlib.suppress(MlflowException):
                self.client.delete_model_version(LOCK_MODEL, str(self.ticket))
            self.ticket = None

    def __enter__(self) -> RegistryLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _ensure_lock_model(client: MlflowClient) -> None:
    if model_exists(client, LOCK_MODEL):
        return
    try:
        client.create_registered_model(
            LOCK_MODEL, description="Promotion/rollback lock tickets (pipeline.registry.lock); not a model.")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":  # else another process created it meanwhile
            raise


@contextlib.contextmanager
def registry_lock(config: RegistryConfig) -> Iterator[RegistryLock]:
    """Hold the promotion lock of ``config.model_name`` for the duration of the block."""
    with RegistryLock(connect(config), config.model_name, config.lock_timeout_s, config.lock_lease_s) as lock:
        yield lock
