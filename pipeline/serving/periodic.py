"""The service's background threads: a stoppable daemon thread, and one that calls a function
every ``interval_s``.

:class:`Periodic` runs the champion-alias poll, the rules refresh and feature expiry. The function
owns its errors (each component records them for /health); one that escapes is logged and the loop
goes on, so a bad tick never silently ends the refreshes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class BackgroundThread:
    """A daemon thread running ``_run`` until :meth:`stop`; ``_run`` watches ``self._stop``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        raise NotImplementedError


class Periodic(BackgroundThread):
    def __init__(self, name: str, interval_s: float, tick: Callable[[], object]) -> None:
        super().__init__(name)
        self.interval_s = interval_s
        self._tick = tick

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._tick()
            except Exception:  # the component should have recorded it; never let the loop die
                log.exception("periodic task %s failed", self.name)
