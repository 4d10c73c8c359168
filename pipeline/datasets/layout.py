"""Where a published dataset's files lie under its root: the one spelling of the layout.

Imported by the producers (ingest's dataset builder and shard writer, the synthetic dataset), by
the manifest's publish and load, and by the test factories. Imports neither torch nor Spark::

    <root>/data/<version>/date=YYYY-MM-DD/shard-00003.parquet   # immutable once written
    <root>/manifests/<version>.json                              # published last, atomically
    <root>/LATEST                                                # name of the newest version

A version's shards are written under a dot-named directory in ``<root>/data/`` (never a version
name, same filesystem) and renamed into place whole. A manifest names each shard by its path
relative to the root (:attr:`pipeline.datasets.manifest.ShardInfo.path`), so readers join that
path to the root and never spell the layout themselves.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = "data"
MANIFESTS_DIR = "manifests"
LATEST_FILE = "LATEST"


def shard_relpath(day: str, shard: int) -> str:
    """Path of shard ``shard`` of date ``day`` (YYYY-MM-DD) below its version's data directory."""
    return f"date={day}/shard-{shard:05d}.parquet"


def version_relpath(version: str, relpath: str) -> str:
    """Root-relative path (what a manifest records) of ``relpath`` below ``version``'s data directory."""
    return f"{DATA_DIR}/{version}/{relpath}"


def shard_path(version: str, day: str, shard: int) -> str:
    """Root-relative path of a shard of ``version``: ``data/<version>/date=<day>/shard-NNNNN.parquet``."""
    return version_relpath(version, shard_relpath(day, shard))


def data_dir(root: Path) -> Path:
    """The directory holding every version's shards (and builds in progress)."""
    return Path(root) / DATA_DIR


def version_dir(root: Path, version: str) -> Path:
    return data_dir(root) / version


def manifest_path(root: Path, version: str) -> Path:
    """Where version ``version``'s manifest is published under the dataset root."""
    return Path(root) / MANIFESTS_DIR / f"{version}.json"


def latest_path(root: Path) -> Path:
    """The file naming the newest published version."""
    return Path(root) / LATEST_FILE
