"""Per-rank streaming reader of a published dataset's shards.

Contract:

* Each rank reads only its part of a split: whole shards when the shard count divides by the
  world size, otherwise a contiguous, deterministic row range of the split. Every row belongs to
  exactly one rank.
* Memory is bounded: rows are read one Parquet row group at a time and shuffled inside a window of
  at most ``shuffle_window_rows`` rows (plus one row group), so a split larger than RAM still trains.
* Shuffling is a pure function of ``(seed, epoch, rank)``: the order of row groups and the
  permutation inside each window come from ``SeedSequence``-derived generators, so replaying an
  epoch from its start, or from a data position, yields the same batches.
* Every rank yields the same number of steps per epoch (the minimum over ranks; the tail rows of an
  epoch are dropped, different ones every epoch), so collectives never wait on a rank that ran dry.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from models.fraud_mlp import squash
from pipeline.datasets.manifest import DatasetManifest, ManifestError, ShardInfo
from pipeline.training.sampling import kept_rows, sample_rows


class DataConfigError(ValueError):
    """The batch geometry does not fit the dataset or the world size."""


def split_global_batch(global_batch_size: int, world_size: int, accumulation_steps: int) -> int:
    """Rows per micro-batch per rank; DataConfigError if the global batch does not split evenly."""
    parts = world_size * accumulation_steps
    if global_batch_size % parts:
        raise DataConfigError(f"data.global_batch_size={global_batch_size} does not split evenly over "
                              f"{world_size} processes x {accumulation_steps} accumulation steps")
    return global_batch_size // parts


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of one row group of one shard file."""

    path: str
    row_group: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Batch:
    numeric: torch.Tensor  # [B, F] float32, NaN where missing
    categorical: torch.Tensor  # [B, C] int64, 0 where unknown
    label: torch.Tensor  # [B] float32 0/1

    def __len__(self) -> int:
        return int(self.label.shape[0])


def _row_groups(root: Path, shards: list[ShardInfo]) -> list[Piece]:
    pieces = []
    for s in shards:
        path = Path(root) / s.path
        try:
            meta = pq.ParquetFile(path).metadata
        except (OSError, pa.ArrowInvalid) as exc:
            raise ManifestError(f"shard {path} is unreadable ({exc}); rebuild the dataset with `fraudctl ingest`") from exc
        if meta.num_rows != s.rows:
            raise ManifestError(f"shard {path} has {meta.num_rows} rows, manifest says {s.rows}")
        for g in range(meta.num_row_groups):
            pieces.append(Piece(str(path), g, 0, meta.row_group(g).num_rows))
    return pieces


def plan_rank_pieces(root: Path, shards: list[ShardInfo], rank: int, world: int) -> list[Piece]:
    """The row groups (or parts of them) that ``rank`` of ``world`` reads, in shard order."""
    if len(shards) % world == 0:
        return _row_groups(root, shards[rank::world])
    groups = _row_groups(root, shards)
    total = sum(p.rows for p in groups)
    lo, hi = rank * total // world, (rank + 1) * total // world
    pieces, offset = [], 0
    for p in groups:
        a, b = max(lo, offset), min(hi, offset + p.rows)
        if a < b:
            pieces.append(Piece(p.path, p.row_group, a - offset, b - offset))
        offset += p.rows
    return pieces


def read_piece(piece: Piece, columns: list[str]) -> pa.Table:
    table = pq.ParquetFile(piece.path).read_row_group(piece.row_group, columns=columns)
    return table.slice(piece.start, piece.rows)


def table_to_arrays(table: pa.Table, manifest: DatasetManifest) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(numeric float32 [n, F] with NaN for nulls, categorical int64 [n, C] with 0 for nulls, label float32 [n])."""
    n = table.num_rows
    numeric = numeric_array(table, manifest.numeric_features)
    cats = list(manifest.categorical_features)
    categorical = np.empty((n, len(cats)), dtype=np.int64)
    for j, name in enumerate(cats):
        categorical[:, j] = pc.fill_null(pc.cast(table.column(name), pa.int64()), 0).to_numpy()
    return numeric, categorical, _label_array(table, manifest.label_column)


def _label_array(table: pa.Table, label_column: str) -> np.ndarray:
    return pc.cast(table.column(label_column), pa.float32()).to_numpy(zero_copy_only=False)


def numeric_array(table: pa.Table, names: tuple[str, ...]) -> np.ndarray:
    numeric = np.empty((table.num_rows, len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        numeric[:, j] = pc.cast(table.column(name), pa.float32()).to_numpy(zero_copy_only=False)
    return numeric


def feature_columns(manifest: DatasetManifest) -> list[str]:
    return [*manifest.numeric_features, *manifest.categorical_features, manifest.label_column]


def _windows(order: np.ndarray, sizes: list[int], window_rows: int) -> list[list[int]]:
    """Consecutive runs of the pieces ``order`` names, each of at least ``window_rows`` rows (the last
    one may be smaller), by the rows each piece yields (``sizes``)."""
    windows, current, rows = [], [], 0
    for i in order:
        current.append(int(i))
        rows += sizes[i]
        if rows >= window_rows:
            windows.append(current)
            current, rows = [], 0
    if current:
        windows.append(current)
    return windows


class TrainStream:
    """Shuffled training batches of one rank, grouped per optimizer step.

    ``micro_batch_rows`` rows per micro-batch, ``accumulation_steps`` micro-batches per step. With
    ``negative_sample_rate`` below 1, each epoch keeps every fraud and that share of the genuine
    rows (:mod:`pipeline.training.sampling`); the labels are read once here to size the epochs.
    """

    def __init__(self, root: Path, manifest: DatasetManifest, rank: int, world: int, micro_batch_rows: int,
                 accumulation_steps: int, shuffle_window_rows: int, seed: int,
                 negative_sample_rate: float = 1.0) -> None:
        if not 0.0 < negative_sample_rate <= 1.0:  # the config refuses it first (pipeline/training/config.py)
            raise DataConfigError(f"negative_sample_rate must be in (0, 1], got {negative_sample_rate}")
        self.manifest = manifest
        self.rank, self.world, self.seed = rank, world, seed
        self.micro_batch_rows = micro_batch_rows
        self.accumulation_steps = accumulation_steps
        self.window_rows = max(1, shuffle_window_rows)
        self.columns = feature_columns(manifest)
        shards = manifest.shards_for("train")
        if not shards:
            raise ManifestError(f"dataset {manifest.dataset}@{manifest.version} has no train shards")
        per_rank = [plan_rank_pieces(root, shards, r, world) for r in range(world)]
        self.pieces = per_rank[rank]
        self.negative_sample_rate = negative_sample_rate
        # Per piece of this rank: its fraud rows (sampling only) and the rows it yields an epoch.
        self.positive_rows: list[np.ndarray] = []
        if negative_sample_rate < 1.0:
            label = manifest.label_column
            positives = [[np.flatnonzero(_label_array(read_piece(p, [label]), label) > 0.5) for p in ps]
                         for ps in per_rank]
            self.positive_rows = positives[rank]
            sizes = [[kept_rows(len(f), p.rows, negative_sample_rate) for f, p in zip(fs, ps, strict=True)]
                     for fs, ps in zip(positives, per_rank, strict=True)]
        else:
            sizes = [[p.rows for p in ps] for ps in per_rank]
        self.piece_rows = sizes[rank]
        rows_per_step = micro_batch_rows * accumulation_steps
        self.steps_per_epoch = min(sum(s) for s in sizes) // rows_per_step
        if self.steps_per_epoch == 0:
            raise DataConfigError(
                f"the train split has too few rows per rank for one step of {rows_per_step} rows per rank: "
                "lower data.global_batch_size or the number of processes")

    @property
    def rows_per_step(self) -> int:
        return self.micro_batch_rows * self.accumulation_steps

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence([self.seed, self.rank, *key]))

    def _read_kept(self, epoch: int, i: int) -> pa.Table:
        """Piece ``i``'s rows of ``epoch``: all of them, or the negative sample's."""
        table = read_piece(self.pieces[i], self.columns)
        if self.negative_sample_rate >= 1.0:
            return table
        # Key (epoch, 0, i + 1): five words ending non-zero, so it is none of the order's or the windows'
        # keys (SeedSequence ignores trailing zeros: (epoch, 0, 0) would be the order's own stream).
        rng = self._rng(epoch, 0, i + 1)
        return table.take(sample_rows(self.positive_rows[i], table.num_rows, self.negative_sample_rate, rng))

    def _shuffled_rows(self, epoch: int, skip_rows: int) -> Iterator[tuple[np.ndarray, ...]]:
        order = self._rng(epoch).permutation(len(self.pieces))
        seen = 0
        for w, window in enumerate(_windows(order, self.piece_rows, self.window_rows)):
            rows = sum(self.piece_rows[i] for i in window)
            if seen + rows <= skip_rows:  # resume: whole window already consumed, not even read
                seen += rows
                continue
            table = pa.concat_tables([self._read_kept(epoch, i) for i in window])
            arrays = table_to_arrays(table, self.manifest)
            perm = self._rng(epoch, w + 1).permutation(rows)[max(0, skip_rows - seen):]
            seen += rows
            yield tuple(a[perm] for a in arrays)

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[list[Batch]]:
        """Steps ``start_step .. steps_per_epoch-1`` of ``epoch``: each a list of micro-batches."""
        if not 0 <= start_step <= self.steps_per_epoch:
            raise ValueError(f"start_step {start_step} outside epoch of {self.steps_per_epoch} steps")
        chunks = self._shuffled_rows(epoch, start_step * self.rows_per_step)
        current: tuple[np.ndarray, ...] = ()
        cursor = 0  # rows of `current` already handed out
        for _ in range(start_step, self.steps_per_epoch):
            parts: list[tuple[np.ndarray, ...]] = []
            need = self.rows_per_step
            while need:
                if not current or cursor == len(current[0]):
                    current, cursor = next(chunks), 0
                take = min(need, len(current[0]) - cursor)
                parts.append(tuple(a[cursor:cursor + take] for a in current))
                cursor += take
                need -= take
            # One copy per step (a step usually comes from one window: the slices are views).
            step = [torch.from_numpy(np.concatenate([p[i] for p in parts])) for i in range(3)]
            b = self.micro_batch_rows
            yield [Batch(step[0][i:i + b], step[1][i:i + b], step[2][i:i + b])
                   for i in range(0, self.rows_per_step, b)]


def iter_eval_chunks(root: Path, manifest: DatasetManifest, split: str, rank: int, world: int,
                     with_ids: bool = False, negative_rate: float = 1.0,
                     seed: int = 0) -> Iterator[tuple[Batch, pa.Table | None]]:
    """This rank's rows of ``split`` in file order, one row group at a time (no shuffling).

    With ``with_ids`` each chunk also carries the ID columns (transaction_id, card_id, event_time).
    With ``negative_rate`` < 1, every fraud and ``round(negative_rate * genuine)`` of each piece's
    genuine rows: a sample fixed by ``seed`` and the piece itself (its file, row group and row range),
    so every epoch of a run, and a resumed run, scores the same rows.
    """
    columns = feature_columns(manifest) + (list(manifest.id_columns) if with_ids else [])
    for piece in plan_rank_pieces(root, manifest.shards_for(split), rank, world):
        table = read_piece(piece, columns)
        if negative_rate < 1.0:
            frauds = np.flatnonzero(_label_array(table, manifest.label_column) > 0.5)
            table = table.take(sample_rows(frauds, table.num_rows, negative_rate, _piece_rng(seed, piece)))
        numeric, categorical, label = table_to_arrays(table, manifest)
        ids = table.select(list(manifest.id_columns)) if with_ids else None
        # Arrow hands back read-only buffers; torch wants writable memory, so the rare copy is made here.
        numeric, categorical, label = (np.require(a, requirements="W") for a in (numeric, categorical, label))
        yield Batch(torch.from_numpy(numeric), torch.from_numpy(categorical), torch.from_numpy(label)), ids


def _piece_rng(seed: int, piece: Piece) -> np.random.Generator:
    key = [seed, zlib.crc32(piece.path.encode()), piece.row_group, piece.start, piece.stop]
    return np.random.default_rng(np.random.SeedSequence(key))


def feature_moments(root: Path, manifest: DatasetManifest, rank: int, world: int) -> torch.Tensor:
    """``[3, F]`` float64: count, sum and sum of squares of the finite numeric values in this rank's
    train rows. Summed over ranks, they give the training-set mean and std (normalisation)."""
    moments = torch.zeros(3, len(manifest.numeric_features), dtype=torch.float64)
    for piece in plan_rank_pieces(root, manifest.shards_for("train"), rank, world):
        table = read_piece(piece, list(manifest.numeric_features))
        x = squash(torch.from_numpy(numeric_array(table, manifest.numeric_features)).double())
        finite = torch.isfinite(x)
        x = torch.where(finite, x, torch.zeros_like(x))
        moments += torch.stack([finite.sum(0).double(), x.sum(0), (x * x).sum(0)])
    return moments


def bin_fit_sample(root: Path, manifest: DatasetManifest, max_rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(numeric float32 ``[n, F]``, label float32 ``[n]``): the rows the numeric bin edges are fitted on.

    The whole train split when it has at most ``max_rows`` rows, else each row kept with probability
    ``max_rows / rows`` (about ``max_rows`` in all), fixed by ``seed``. Read one row group at a time,
    keeping only sampled rows, so memory is bounded by the sample. Reads every train shard: meant for
    one rank, whose result is broadcast.
    """
    pieces = plan_rank_pieces(root, manifest.shards_for("train"), 0, 1)
    rate = min(1.0, max_rows / max(sum(p.rows for p in pieces), 1))
    columns = [*manifest.numeric_features, manifest.label_column]
    numeric = [np.zeros((0, len(manifest.numeric_features)), np.float32)]
    labels = [np.zeros(0, np.float32)]
    for i, piece in enumerate(pieces):
        table = read_piece(piece, columns)
        if rate < 1.0:
            table = table.filter(pa.array(np.random.default_rng([seed, i]).random(piece.rows) < rate))
        numeric.append(numeric_array(table, manifest.numeric_features))
        labels.append(pc.cast(table.column(manifest.label_column), pa.float32()).to_numpy(zero_copy_only=False))
    return np.concatenate(numeric), np.concatenate(labels)


def normalization_from_moments(moments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    count = moments[0].clamp(min=1.0)
    mean = moments[1] / count
    var = (moments[2] / count - mean * mean).clamp(min=0.0)
    return mean.float(), var.sqrt().float()
