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
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NULL_CODE = 0


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

    def code(self, column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, IdVocabulary]:
        """``(codes, vocabulary)``: int32 codes of ``column``'s values (null: :data:`NULL_CODE`) under
        the returned vocabulary, which is this one, or this one with the unseen values appended."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        # Hash each row once (dictionary encoding), then look only the distinct values up.
        encoded = pc.dictionary_encode(column.cast(pa.string()))
        distinct = encoded.dictionary
        found = pc.index_in(distinct, value_set=self.values)
        unseen = found.is_null().to_numpy(zero_copy_only=False)
        codes = found.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int32)
        codes[unseen] = len(self) + np.arange(int(unseen.sum()), dtype=np.int32)
        grown = self if not unseen.any() else IdVocabulary(
            self.generation, pa.concat_arrays([self.values, distinct.filter(pa.array(unseen))]))
        by_index = np.append(codes, np.int32(NULL_CODE))  # index len(distinct): a null row
        rows = pc.fill_null(encoded.indices, len(distinct)).to_numpy(zero_copy_only=False)
        return by_index[rows], grown
