"""Start-up's heap leaves the garbage collector's reach once the service is seeded."""

from __future__ import annotations

import gc
import threading
import weakref
from dataclasses import replace

from fastapi.testclient import TestClient

import pipeline.serving.app as app_module
from pipeline.serving.heap import YOUNG_THRESHOLD, freeze_startup_heap
from tests.serving.conftest import app_of


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_freezing_collects_first_then_moves_every_live_object_out_of_collections():
    threshold = gc.get_threshold()
    garbage, kept = Node(), Node()
    garbage_ref = weakref.ref(garbage)
    del garbage
    assert any(kept is o for o in gc.get_objects())
    try:
        frozen = freeze_startup_heap()
        assert garbage_ref() is None  # collected before the freeze, not frozen for ever
        # Frozen objects still die by reference counting (other threads run meanwhile): never more.
        assert frozen >= gc.get_freeze_count() > 0.99 * frozen > 0
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD
        assert not any(kept is o for o in gc.get_objects())  # alive, frozen: no collection walks it
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_the_app_freezes_once_started_and_seeded_only_when_configured(serving_config, make_service, champion,
                                                                       monkeypatch):
    calls: list[str] = []
    frozen = threading.Event()

    def fake_freeze() -> int:
        calls.append("freeze")
        frozen.set()
        return 0

    monkeypatch.setattr(app_module, "freeze_startup_heap", fake_freeze)
    freezing = replace(serving_config, server=replace(serving_config.server, freeze_heap=True))
    for config, expected in ((serving_config, 0), (freezing, 1)):
        calls.clear()
        frozen.clear()
        with TestClient(app_of(make_service(config))) as http:
            assert http.get("/ready").status_code == 200
            if expected:
                assert frozen.wait(timeout=30), "the app never froze the heap after start-up"
        # Shutdown is over: the freezing task (if any) has run or was cancelled, so no call can come later.
        assert len(calls) == expected
