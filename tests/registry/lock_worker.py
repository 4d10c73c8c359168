"""A separate process using the registry lock, for tests/registry/test_lock.py.

``python -m tests.registry.lock_worker count URI NAME ROUNDS LOG``: ROUNDS times, under the lock,
read the ``counter`` tag of registered model NAME, pause, write it back plus one (a lost update if
two processes interleave), and append ``start end`` of the critical section to LOG.

``python -m tests.registry.lock_worker hold URI NAME LEASE_S``: take the lock, print ``held``, wait
for a line on stdin, then print ``still held`` or ``lost`` (what ``ensure_held`` says) and release.
"""

from __future__ import annotations

import sys
import time

from mlflow import MlflowClient

from pipeline.registry.lock import LockLost, RegistryLock


def count(client: MlflowClient, name: str, rounds: int, log: str) -> None:
    for _ in range(rounds):
        with RegistryLock(client, name, timeout_s=120, lease_s=30):
            start = time.time()
            value = int(client.get_registered_model(name).tags["counter"])
            time.sleep(0.02)
            client.set_registered_model_tag(name, "counter", str(value + 1))
            with open(log, "a") as fh:
                fh.write(f"{start} {time.time()}\n")


def hold(client: MlflowClient, name: str, lease_s: float) -> None:
    with RegistryLock(client, name, timeout_s=30, lease_s=lease_s) as lock:
        print("held", flush=True)
        sys.stdin.readline()
        try:
            lock.ensure_held()
            print("still held", flush=True)
        except LockLost:
            print("lost", flush=True)


def main(argv: list[str]) -> None:
    mode, uri, name = argv[:3]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    if mode == "count":
        count(client, name, int(argv[3]), argv[4])
    else:
        hold(client, name, float(argv[3]))


if __name__ == "__main__":
    main(sys.argv[1:])
