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
dataset version, a model directory; :func:`staged_dir` builds one): everything in it is flushed,
then one rename publishes it. Replacing an existing directory is one atomic exchange of the two
names (Linux ``renameat2(RENAME_EXCHANGE)``), so ``final`` never stops existing as a plain
directory: every reader that opens it by path keeps working, and none sees it missing. A reader of
several files inside it still reads them one path at a time, so one that must pair them (weights
with their config) reads a directory that is not replaced under it, or checks that it was not.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
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


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100  # linux/fcntl.h: paths relative to the working directory, as os.replace takes them
# Refusals that mean "this filesystem or kernel cannot exchange" (NFS, old FUSE: EINVAL; a kernel
# before 3.15: ENOSYS), as opposed to errors about the paths themselves.
_EXCHANGE_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)  # glibc >= 2.28
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    _renameat2.restype = ctypes.c_int

log = logging.getLogger(__name__)
_devices_warned: set[int] = set()  # st_dev of each filesystem already reported unable to exchange


def exchange_paths(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` (both must exist, same filesystem) in one atomic step.

    Returns False, touching nothing, when the C library or the filesystem cannot exchange; raises
    ``OSError`` for any other refusal (a missing path: ``FileNotFoundError``).
    """
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _EXCHANGE_UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def old_dir_path(final: Path) -> Path:
    """Where :func:`publish_dir`'s fallback swap parks the previous ``final`` between its renames."""
    return final.with_name(f".old-{final.name}")


def restore_interrupted_publish(final: Path) -> bool:
    """After a kill during :func:`publish_dir`'s fallback swap (``final`` gone, the previous one
    parked at :func:`old_dir_path`), put the previous directory back. Returns True when it did.
    Call before deleting dot-name leftovers, while no other process publishes ``final``."""
    final, old = Path(final), old_dir_path(Path(final))
    if final.exists() or not old.is_dir():
        return False
    os.replace(old, final)
    fsync_path(final.parent)
    return True


def _warn_no_exchange(final: Path) -> None:
    """Once per filesystem: its directories are replaced with a moment where they are missing."""
    device = final.parent.stat().st_dev
    if device not in _devices_warned:
        _devices_warned.add(device)
        log.warning("%s: this filesystem (or C library) cannot exchange two names atomically; directories "
                    "on it are replaced in two renames, between which a reader finds none", final)


def _swap_in_two_renames(staging: Path, final: Path) -> None:
    """The fallback where the filesystem cannot exchange: ``final`` is missing between the renames
    (a reader sees no directory; a kill there leaves it at :func:`old_dir_path`)."""
    _warn_no_exchange(final)
    old = old_dir_path(final)
    shutil.rmtree(old, ignore_errors=True)
    os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)


def publish_dir(staging: Path, final: Path, *, keep_existing: bool = False) -> bool:
    """Make the complete directory ``staging`` appear as ``final`` atomically: a reader opening
    ``final`` finds the previous directory or the whole new one, never neither. Returns True when
    ``final`` was kept instead.

    ``keep_existing``: ``final`` holds the same content already (content-addressed names, or the
    caller checked it): ``staging`` is dropped. Otherwise an existing ``final`` is exchanged with
    ``staging`` in one step and then deleted from under the staging name; a kill before that
    deletion leaves the previous content under the staging name (a dot-name leftover for the
    owner to remove). Where the filesystem cannot exchange, see :func:`_swap_in_two_renames`.
    ``staging`` must be on ``final``'s filesystem (a sibling, by convention a dot-name).
    """
    staging, final = Path(staging), Path(final)
    if keep_existing and final.is_dir():
        shutil.rmtree(staging, ignore_errors=True)
        return True
    _fsync_tree(staging)
    if not final.exists():
        os.rename(staging, final)
    elif exchange_paths(staging, final):
        shutil.rmtree(staging, ignore_errors=True)  # now the previous content
    else:
        _swap_in_two_renames(staging, final)
    fsync_path(final.parent)
    return False


@contextmanager
def staged_dir(final: Path) -> Iterator[Path]:
    """``with staged_dir(d) as tmp:`` build the directory ``tmp`` (created empty, beside ``d``);
    when the block succeeds it is published as ``d`` (:func:`publish_dir`, replacing any previous
    ``d``), when it raises ``d`` is untouched and ``tmp`` is removed. A kill leaves
    ``.<name>.tmp-<pid>/`` for the owner to remove."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        publish_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
