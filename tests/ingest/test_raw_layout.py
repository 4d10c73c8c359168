"""The raw store's identity (kept when it moves, new for a copy) and its lock."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from pipeline.ingest.raw_layout import STORE_FILE, IngestLocked, RawStore, StoreFileUnreadable


def test_a_store_gets_an_id_once_and_keeps_it(tmp_path):
    store = RawStore(tmp_path / "raw")
    assert not (store.root / STORE_FILE).exists()  # a store made before ids: one is made on first use
    first = store.store_id()
    assert RawStore(tmp_path / "raw").store_id() == first
    assert json.loads((store.root / STORE_FILE).read_text()) == {"store_id": first, "root": str(store.root.resolve())}


def test_a_moved_store_keeps_its_id_and_a_copy_gets_its_own(tmp_path):
    original = RawStore(tmp_path / "a" / "raw")
    store_id = original.store_id()
    shutil.copytree(original.root, tmp_path / "copy" / "raw")
    copy_id = RawStore(tmp_path / "copy" / "raw").store_id()
    assert copy_id != store_id
    assert original.store_id() == store_id  # the copy took nothing from the original

    (tmp_path / "b").mkdir()
    os.rename(original.root, tmp_path / "b" / "raw")
    moved = RawStore(tmp_path / "b" / "raw")
    assert moved.store_id() == store_id
    assert json.loads((moved.root / STORE_FILE).read_text())["root"] == str(moved.root.resolve())
    assert RawStore(tmp_path / "copy" / "raw").store_id() == copy_id


def test_the_same_store_by_another_path_is_the_same_store(tmp_path):
    store = RawStore(tmp_path / "raw")
    store_id = store.store_id()
    (tmp_path / "link").symlink_to(store.root)
    recorded = (store.root / STORE_FILE).read_text()
    assert RawStore(tmp_path / "link").store_id() == store_id
    assert (store.root / STORE_FILE).read_text() == recorded


def test_an_unreadable_id_file_says_what_to_do(tmp_path):
    store = RawStore(tmp_path / "raw")
    (store.root / STORE_FILE).parent.mkdir(parents=True)
    (store.root / STORE_FILE).write_text("{")
    with pytest.raises(StoreFileUnreadable, match="restore it from a backup, or delete it"):
        store.store_id()


def test_one_ingest_run_at_a_time_and_the_error_names_the_holder(tmp_path):
    store = RawStore(tmp_path / "raw")
    with store.locked():
        with pytest.raises(IngestLocked, match=rf"another ingest run is using {store.root} \(lock .*, "
                                               rf"held by pid {os.getpid()} on .*\); wait for it to finish"):
            with RawStore(tmp_path / "raw").locked():
                pass
    with store.locked():
        pass
