"""Integer codes for id strings that mean the same thing from one night to the next.

The window kernel needs ids as integers (any coding consistent within one call). Coding a 30-day
lookback afresh every night means hashing every id of those days again; a vocabulary that only
grows lets each day be coded once, when it is first read, and merged with any other day coded by
the same vocabulary by concatenation alone.

Contract: code 0 stands for null; a value's code is its position in ``values``; coding appends the
values it has not seen and never moves one it has. So arrays coded by a vocabulary stay valid under
every later vocabulary of the same ``generation`` (one that is at least as long). A vocabulary
started afresh gets a new random generation: codes of another generation mean nothing under it.
Pure: coding returns the grown vocabulary, storing it is the caller's job.

Compaction (:meth:`IdVocabulary.compacted`) is the one way codes move: it starts a new generation
holding only the values still in use, in their old order, and returns the map from old codes to new
ones; every stored array of the old generation must be remapped with it or dropped (the lookback
cache does this in one directory swap: :meth:`pipeline.datasets.lookback_cache.LookbackCache.compact`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NULL_CODE = 0
MAX_IDS = np.iinfo(np.int32).max  # codes are int32; compaction keeps a vocabulary far below this


class VocabularyFull(RuntimeError):
    """Coding would give a code past int32: the lookback cache should have compacted long before."""


@dataclass(frozen=True)
class IdVocabulary:
    """Distinct id strings in the order they were first seen; ``values[0]`` is null."""

    generation: str
    values: pa.Array  # string

    @staticmethod
    def start() -> IdVocabulary:
        return IdVocabulary(uuid.uuid4().hex, pa.array([None], pa.string()))

    def __len__(self) -> int:
        return len(self.values)

    def code_columns(self, *columns: pa.Array | pa.ChunkedArray) -> tuple[list[np.ndarray], IdVocabulary]:
        """``([codes of each column], vocabulary)``: as :meth:`code` on each column in turn (the same
        codes, the same grown vocabulary), with the vocabulary hashed once instead of once per column."""
        chunks = [c.cast(pa.string()) for column in columns
                  for c in (column.chunks if isinstance(column, pa.ChunkedArray) else [column])]
        codes, grown = self.code(pa.chunked_array(chunks, pa.string()))
        ends = np.cumsum([len(column) for column in columns])
        return np.split(codes, ends[:-1]), grown

    def code(self, column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, IdVocabulary]:
        """``(codes, vocabulary)``: int32 codes of ``column``'s values (null: :data:`NULL_CODE`) under
        the returned vocabulary, which is this one, or this one with the unseen values appended.
        Raises :class:`VocabularyFull` when the grown vocabulary would not fit int32 codes."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks() if column.num_chunks else pa.array([], pa.string())
        # Hash each row once (dictionary encoding), then look only the distinct values up: the
        # vocabulary's hash set is built once per call, the reason to code several columns in one.
        encoded = pc.dictionary_encode(column.cast(pa.string()))
        distinct = encoded.dictionary
        found = pc.index_in(distinct, value_set=self.values)
        unseen = found.is_null().to_numpy(zero_copy_only=False)
        codes = found.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int32)
        if len(self) + int(unseen.sum()) > MAX_IDS:
            raise VocabularyFull(f"{len(self)} ids + {int(unseen.sum())} new exceed int32 codes; compact the "
                                 "lookback cache (delete its _lookback/ directory: it is only a cache)")
        codes[unseen] = len(self) + np.arange(int(unseen.sum()), dtype=np.int32)
        grown = self if not unseen.any() else IdVocabulary(
            self.generation, pa.concat_arrays([self.values, distinct.filter(pa.array(unseen))]))
        by_index = np.append(codes, np.int32(NULL_CODE))  # index len(distinct): a null row
        rows = pc.fill_null(encoded.indices, len(distinct)).to_numpy(zero_copy_only=False)
        return by_index[rows], grown

    def compacted(self, live: np.ndarray) -> tuple[IdVocabulary, np.ndarray]:
        """``(vocabulary, remap)``: a new generation holding only the values whose codes ``live``
        (a bool mask over this vocabulary) marks, in their old order, null still at code 0; and
        ``remap``, int32 over the old codes, giving each live code its new one (dead codes: -1)."""
        keep = np.asarray(live, dtype=bool).copy()
        keep[NULL_CODE] = True
        remap = np.full(len(self), -1, dtype=np.int32)
        remap[keep] = np.arange(int(keep.sum()), dtype=np.int32)
        values = self.values.filter(pa.array(keep))
        return IdVocabulary(uuid.uuid4().hex, values), remap
