"""Read rows of a published dataset into memory (evaluation, the gate, baselines).

Training streams shards per rank (pipeline/training); this module is for windows small enough
to score at once. Only shards listed in a published manifest are read, and each is checked
against its recorded row count.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from pipeline.datasets.manifest import DatasetManifest, ManifestError, ShardInfo


def read_shards(root: Path, shards: list[ShardInfo], columns: list[str] | None = None) -> pd.DataFrame:
    """Concatenate ``shards`` (paths relative to ``root``) in order, verifying row counts."""
    frames = []
    for s in shards:
        path = Path(root) / s.path
        try:
            table = pq.read_table(path, columns=columns)
        except (OSError, ValueError) as exc:
            raise ManifestError(f"shard {path} is unreadable ({exc}); rebuild the dataset with `fraudctl ingest`") from exc
        if table.num_rows != s.rows:
            raise ManifestError(f"shard {path} has {table.num_rows} rows, manifest says {s.rows}")
        frames.append(table.to_pandas())
    if not frames:
        return pd.DataFrame(columns=columns or [])
    return pd.concat(frames, ignore_index=True)


def read_split(root: Path, manifest: DatasetManifest, split: str) -> pd.DataFrame:
    """All rows of a named split (``train`` / ``validation`` / ``test``)."""
    return read_shards(root, manifest.shards_for(split))


def read_window(root: Path, manifest: DatasetManifest, start: str, end: str) -> pd.DataFrame:
    """All rows whose date is in ``[start, end]`` (YYYY-MM-DD, inclusive)."""
    shards = sorted((s for s in manifest.shards if start <= s.date <= end), key=lambda s: (s.date, s.shard))
    if not shards:
        dates = sorted({s.date for s in manifest.shards})
        span = f"{dates[0]}..{dates[-1]}" if dates else "no dates"
        raise ManifestError(f"dataset {manifest.dataset}@{manifest.version} has no rows in {start}..{end} (it covers {span})")
    return read_shards(root, shards)
