"""The project's one atomic-publish helpers: readers see the old file (or directory) or the whole new one."""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import math
import multiprocessing
import os
from pathlib import Path

import pytest

from pipeline import atomic
from pipeline.atomic import (
    atomic_path,
    old_dir_path,
    publish_dir,
    restore_interrupted_publish,
    staged_dir,
    write_json_atomic,
    write_text_atomic,
)


def test_writes_create_parents_replace_the_file_and_leave_no_temporary(tmp_path):
    path = tmp_path / "a" / "b" / "state.json"
    write_json_atomic(path, {"offsets": [1, 2]})
    write_json_atomic(path, {"offsets": [3]})
    assert json.loads(path.read_text()) == {"offsets": [3]}
    assert path.read_text().endswith("\n")
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]


def test_nan_survives_the_json_form(tmp_path):
    write_json_atomic(tmp_path / "m.json", {"auc": float("nan")})
    assert math.isnan(json.loads((tmp_path / "m.json").read_text())["auc"])


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "manifest.json"
    write_text_atomic(path, "old\n")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_path(path) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("disk full")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_the_new_content_is_invisible_until_the_block_ends(tmp_path):
    path = tmp_path / "scores.txt"
    write_text_atomic(path, "v1")
    with atomic_path(path, durable=False) as tmp:
        tmp.write_text("v2")
        assert path.read_text() == "v1"
        assert tmp.parent == path.parent and tmp.name.startswith(".")  # same filesystem, hidden
    assert path.read_text() == "v2"


def build(directory, files: dict[str, str]):
    for name, text in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)
    return directory


def test_a_directory_is_published_whole_and_replaces_the_previous_one(tmp_path):
    final = tmp_path / "step-1"
    assert publish_dir(build(tmp_path / ".tmp-step-1", {"a.pt": "1", "sub/b.pt": "2"}), final) is False
    assert publish_dir(build(tmp_path / ".tmp-step-1", {"a.pt": "new"}), final) is False
    assert sorted(str(p.relative_to(final)) for p in final.rglob("*")) == ["a.pt"]
    assert (final / "a.pt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]  # no staging, no .old- left


def test_an_existing_directory_is_kept_when_the_caller_says_it_holds_the_same_content(tmp_path):
    final = tmp_path / "v-abc"
    publish_dir(build(tmp_path / ".build-1", {"shard.parquet": "x"}), final)
    assert publish_dir(build(tmp_path / ".build-2", {"shard.parquet": "y"}), final, keep_existing=True) is True
    assert (final / "shard.parquet").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v-abc"]
    # Nothing there yet: keep_existing publishes.
    assert publish_dir(build(tmp_path / ".build-3", {"s": "z"}), tmp_path / "v-new", keep_existing=True) is False


FILES = ("weights", "config", "extra")  # each file of version v holds "v": a mix shows as two values


def _read_at(directory_fd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY, dir_fd=directory_fd)
    try:
        return os.read(fd, 64)  # each file holds a version number
    finally:
        os.close(fd)


def _read_published(final: Path, stop: Path, out: Path) -> None:
    """A reader process: opens ``final`` as a directory, then reads every file through that handle
    (one directory's content, whatever is published meanwhile), until ``stop`` exists."""
    counts = {"missing": 0, "mixed": 0, "incomplete": 0, "replaced_while_reading": 0, "whole": 0}
    versions = set()
    while not stop.exists():
        try:
            fd = os.open(final, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            counts["missing"] += 1
            continue
        try:
            texts, vanished = [], False
            for name in FILES:
                try:
                    texts.append(_read_at(fd, name))
                except FileNotFoundError:
                    vanished = True
            if len(set(texts)) > 1:
                counts["mixed"] += 1
            elif vanished:  # a directory deleted under the reader is fine only once it is no longer published
                replaced = os.stat(final).st_ino != os.fstat(fd).st_ino
                counts["replaced_while_reading" if replaced else "incomplete"] += 1
            else:
                counts["whole"] += 1
                versions.add(texts[0].decode())
        finally:
            os.close(fd)
    out.write_text(json.dumps({**counts, "versions": len(versions)}))


@pytest.mark.slow  # a reader process beside 500 replaces
def test_a_reader_never_sees_a_replaced_directory_missing_or_mixed(tmp_path):
    final, stop, out = tmp_path / "date=2026-02-07", tmp_path / "stop", tmp_path / "reader.json"
    publish_dir(build(tmp_path / ".build", dict.fromkeys(FILES, "0")), final)
    reader = multiprocessing.get_context("fork").Process(target=_read_published, args=(final, stop, out))
    reader.start()
    try:
        for version in range(1, 501):
            with staged_dir(final) as staging:
                build(staging, dict.fromkeys(FILES, str(version)))
    finally:
        stop.touch()
        reader.join(60)
    seen = json.loads(out.read_text())
    assert seen["versions"] > 10, seen  # the reader ran through the replaces, not before or after them
    assert (seen["missing"], seen["mixed"], seen["incomplete"]) == (0, 0, 0), seen
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([final.name, "stop", "reader.json"])


def _refused_by_the_filesystem(*args):
    ctypes.set_errno(errno.EINVAL)  # what NFS answers RENAME_EXCHANGE
    return -1


@pytest.mark.parametrize("renameat2", [None, _refused_by_the_filesystem], ids=["no_libc_symbol", "einval"])
def test_a_filesystem_that_cannot_exchange_falls_back_to_two_renames_and_says_so(tmp_path, monkeypatch, caplog,
                                                                                 renameat2):
    monkeypatch.setattr(atomic, "_renameat2", renameat2)
    monkeypatch.setattr(atomic, "_devices_warned", set())
    final = tmp_path / "best"
    publish_dir(build(tmp_path / ".tmp-best", {"a": "old"}), final)
    with caplog.at_level(logging.WARNING, logger=atomic.__name__):
        publish_dir(build(tmp_path / ".tmp-best", {"a": "new"}), final)
    assert (final / "a").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["best"]
    assert "cannot exchange" in caplog.text


def test_a_kill_between_the_fallback_renames_is_undone_by_restoring_the_parked_directory(tmp_path):
    final = tmp_path / "best"
    publish_dir(build(tmp_path / ".tmp-best", {"a": "old"}), final)
    os.replace(final, old_dir_path(final))  # the state right after the fallback's first rename
    assert restore_interrupted_publish(final) is True
    assert (final / "a").read_text() == "old" and not old_dir_path(final).exists()
    assert restore_interrupted_publish(final) is False  # nothing parked: nothing to do


def test_a_failed_build_leaves_the_published_directory_and_no_staging(tmp_path):
    final = tmp_path / "model"
    with staged_dir(final) as staging:
        build(staging, {"weights": "1"})
    with pytest.raises(RuntimeError, match="disk full"):
        with staged_dir(final) as staging:
            build(staging, {"weights": "2"})
            raise RuntimeError("disk full")
    assert (final / "weights").read_text() == "1" and [p.name for p in tmp_path.iterdir()] == ["model"]
