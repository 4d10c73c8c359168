"""A daemon thread that calls one function every ``interval_s`` until stopped.

Used for the champion-alias poll, the rules refresh and feature expiry. The function owns its
errors (each component records them for /health); one that escapes is logged and the loop goes
on, so a bad tick never silently ends the refreshes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    def __init__(self, name: str, interval_s: float, tick: Callable[[], object]) -> None:
        self.name = name
        self.interval_s = interval_s
        self._tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._tick()
            except Exception:  # the component should have recorded it; never let the loop die
                log.exception("periodic task %s failed", self.name)
