"""Atomic file and directory publishing, the one implementation for the project.

A reader of ``path`` sees the previous file or the complete new one, never a torn mix: the bytes go
to a temporary file beside ``path`` (same filesystem, so the rename is atomic), are flushed to
disk, and the temporary file is renamed over ``path`` with ``os.replace``; then the directory is
flushed so the rename itself survives a power cut. If writing fails, ``path`` is untouched and the
temporary file is removed. A process killed mid-write leaves ``.<name>.tmp-<pid>`` behind, which a
reader never opens (leading dot, different name); cleaning up leftovers is the owner's job.

``durable=False`` skips both fsyncs (a file rewritten often that may be lost on a power cut, but
must still never be torn).

:func:`publish_dir` does the same for a directory built beside its final name (a checkpoint, a
dataset version): everything in it is flushed, then one rename publishes it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def temporary_path(path: Path) -> Path:
    """Where the new content of ``path`` is written before the rename (unique per process)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_path(path: Path) -> None:
    """Flush a file's data, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: Path, *, durable: bool = True) -> Iterator[Path]:
    """``with atomic_path(p) as tmp:`` write ``tmp`` with any writer (Parquet, torch.save, ...); when the
    block succeeds ``tmp`` replaces ``p``, when it raises ``p`` is untouched and ``tmp`` is removed.

    Creates the parent directory.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        yield tmp
        if durable:
            fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_path(path.parent)


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: Path, text: str, *, durable: bool = True) -> None:
    write_bytes_atomic(path, text.encode("utf-8"), durable=durable)


def write_json_atomic(path: Path, obj: Any, *, durable: bool = True) -> None:
    """``obj`` as indented JSON with sorted keys and a final newline (NaN allowed: metrics may be NaN)."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=True) + "\n", durable=durable)


def _fsync_tree(root: Path) -> None:
    """Flush every file under ``root``, then every directory, deepest first."""
    directories = [root]
    for path in root.rglob("*"):
        if path.is_dir():
            directories.append(path)
        elif path.is_file():
            fsync_path(path)
    for directory in sorted(directories, key=lambda p: len(p.parts), reverse=True):
        fsync_path(directory)


def publish_dir(staging: Path, final: Path, *, keep_existing: bool = False) -> bool:
    """Make the complete directory ``staging`` appear as ``final`` in one rename: a reader sees the
    previous directory or the whole new one. Returns True when ``final`` was kept instead.

    ``keep_existing``: ``final`` holds the same content already (content-addressed names, or the
    caller checked it): ``staging`` is dropped. Otherwise an existing ``final`` is swapped out via
    ``.old-<name>`` (its owner restores it if a kill leaves ``final`` missing) and deleted after.
    ``staging`` must be on ``final``'s filesystem (a sibling, by convention a dot-name).
    """
    staging, final = Path(staging), Path(final)
    if keep_existing and final.is_dir():
        shutil.rmtree(staging, ignore_errors=True)
        return True
    _fsync_tree(staging)
    old = final.with_name(f".old-{final.name}")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    fsync_path(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    return False
