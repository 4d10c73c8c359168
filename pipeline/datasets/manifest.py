"""The published-dataset contract between ingest (writer) and training/evaluation (readers).

Where the files lie under a dataset root (shards, ``manifests/<version>.json``, ``LATEST``) is
:mod:`pipeline.datasets.layout`'s. A version's data directory is written completely *before* its
manifest is renamed into ``manifests/``; readers look only at manifests, so a killed writer
leaves at most an orphan data directory that nothing references. ``LATEST`` is replaced with
``os.replace`` too. ``version`` is derived from the content hash, so rerunning the same build
reproduces the same version name and the same bytes (idempotence is checkable by hash).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from pipeline.atomic import write_text_atomic
from pipeline.datasets.layout import latest_path, manifest_path

MANIFEST_FORMAT = 1
LABEL_COLUMN = "label"
# Shard column: when the row's fraud was first reported (null: no fraud report by the label cutoff).
REPORTED_AT_COLUMN = "reported_at"
# Columns every shard carries besides features: identify the row and group metrics by card/day.
ID_COLUMNS = ("transaction_id", "card_id", "event_time")


class ManifestError(RuntimeError):
    """A manifest is missing, unreadable or inconsistent with its shards."""


@dataclass(frozen=True)
class ShardInfo:
    """One Parquet shard: its path relative to the dataset root, its date and counts."""

    path: str
    date: str  # YYYY-MM-DD (event date of every row in it)
    shard: int  # index within the date, 0..num_shards-1
    rows: int
    frauds: int
    sha256: str


@dataclass(frozen=True)
class DateWindow:
    """Inclusive date range ``[start, end]`` as YYYY-MM-DD strings."""

    start: str
    end: str

    def contains(self, date: str) -> bool:
        return self.start <= date <= self.end


@dataclass(frozen=True)
class DatasetManifest:
    """What a published dataset version holds; the only thing readers trust.

    ``numeric_features`` are float columns; ``categorical_features`` maps each integer-coded
    column to its cardinality (codes are in ``[0, cardinality)``; 0 is reserved for unknown).
    ``splits`` names date windows (``train``, ``validation``, ``test``): a shard belongs to the
    split whose window contains its date. ``kafka_offsets`` records, per topic and partition,
    the ``[start, end)`` offsets whose records the raw store held when this was built.
    """

    dataset: str
    version: str
    created_at: str
    schema_version: int
    feature_version: int
    numeric_features: tuple[str, ...]
    categorical_features: dict[str, int]
    splits: dict[str, DateWindow]
    label_cutoff: str
    num_shards_per_date: int
    shards: tuple[ShardInfo, ...]
    kafka_offsets: dict[str, dict[str, list[int]]]
    content_hash: str
    label_column: str = LABEL_COLUMN
    id_columns: tuple[str, ...] = ID_COLUMNS
    extra: dict[str, Any] = field(default_factory=dict)
    format: int = MANIFEST_FORMAT

    def shards_for(self, split: str) -> list[ShardInfo]:
        """Shards of a named split, ordered by (date, shard index)."""
        if split not in self.splits:
            raise ManifestError(f"dataset {self.dataset}@{self.version} has no split {split!r} "
                                f"(has {sorted(self.splits)})")
        window = self.splits[split]
        return sorted((s for s in self.shards if window.contains(s.date)), key=lambda s: (s.date, s.shard))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> DatasetManifest:
        d = json.loads(text)
        if d.get("format") != MANIFEST_FORMAT:
            raise ManifestError(f"manifest format {d.get('format')} not supported (expected {MANIFEST_FORMAT})")
        d["numeric_features"] = tuple(d["numeric_features"])
        d["id_columns"] = tuple(d["id_columns"])
        d["splits"] = {k: DateWindow(**v) for k, v in d["splits"].items()}
        d["shards"] = tuple(ShardInfo(**s) for s in d["shards"])
        return DatasetManifest(**d)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_hash(shards: list[ShardInfo] | tuple[ShardInfo, ...], schema: dict[str, Any]) -> str:
    """Hash of the data (shard bytes, in order) and the schema: same data -> same hash."""
    h = hashlib.sha256()
    h.update(json.dumps(schema, sort_keys=True).encode())
    for s in sorted(shards, key=lambda s: (s.date, s.shard)):
        h.update(f"{s.date}/{s.shard}/{s.rows}/{s.sha256}\n".encode())
    return h.hexdigest()


def publish_manifest(root: Path, manifest: DatasetManifest) -> Path:
    """Publish ``manifest`` under ``root`` (its shards must already be complete) and point LATEST at
    it, unless LATEST names a version with a later label cutoff: LATEST is the newest data, never
    moved back. A backfill of an older range (or a rerun of an older night) is published and read by
    its version; the gate's holdout, training and evaluation keep defaulting to the newest.

    Checks every shard exists with the recorded hash before publishing, so a manifest never
    references missing or partial data.
    """
    for s in manifest.shards:
        p = root / s.path
        if not p.is_file():
            raise ManifestError(f"refusing to publish {manifest.version}: shard {p} is missing")
        if file_sha256(p) != s.sha256:
            raise ManifestError(f"refusing to publish {manifest.version}: shard {p} does not match its hash")
    target = manifest_path(root, manifest.version)
    write_text_atomic(target, manifest.to_json())
    if _newest(root, manifest):
        write_text_atomic(latest_path(root), manifest.version + "\n")
    return target


def latest_version(root: Path) -> str | None:
    """The version LATEST names under ``root``; None when nothing is published."""
    latest = latest_path(Path(root))
    return latest.read_text().strip() if latest.is_file() else None


def _newest(root: Path, manifest: DatasetManifest) -> bool:
    """Whether ``manifest`` is at least as new (label cutoff) as LATEST's; a LATEST that names no
    readable manifest is replaced."""
    if latest_version(root) is None:
        return True
    try:
        current = load_manifest(root)
    except ManifestError:
        return True
    return date.fromisoformat(manifest.label_cutoff) >= date.fromisoformat(current.label_cutoff)


def load_manifest(root: Path, version: str | None = None) -> DatasetManifest:
    """Load a published manifest (``LATEST`` when ``version`` is None)."""
    root = Path(root)
    if version is None:
        latest = latest_path(root)
        if not latest.is_file():
            raise ManifestError(
                f"no published dataset under {root}: run `fraudctl ingest` to build one"
            )
        version = latest.read_text().strip()
    path = manifest_path(root, version)
    if not path.is_file():
        raise ManifestError(f"dataset version {version!r} is not published under {root}")
    try:
        return DatasetManifest.from_json(path.read_text())
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ManifestError(f"manifest {path} is corrupt: {exc}") from exc
