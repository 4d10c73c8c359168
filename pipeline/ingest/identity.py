"""What makes two records the same event, as 64-bit hashes (pure numpy over Arrow buffers).

* identity: a transaction is its ``transaction_id``; a label is ``(transaction_id, is_fraud,
  reported_at)``, since several reports for one payment are legitimate (a fraud report, then a
  clearing review). Two records with one identity are copies of one event.
* content: every contract field, typed (formatting of the JSON text and unknown fields are not
  compared). Two copies with equal content are an identical resend (``DUPLICATE``); with different
  content, a ``CONFLICTING_DUPLICATE``.

The hashes are this module's own (FNV-1a over the bytes, a splitmix64 finish per column), so they
never change with a library upgrade: the identity index (:mod:`pipeline.ingest.id_index`) keeps
them for the whole history. A transaction's identity hash is the hash of its ``transaction_id``
alone, so a label's ``transaction_id`` can be looked up among transactions with the same function
(:func:`transaction_id_hashes`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract import FIELDS_BY_KIND, Kind

IDENTITY_BY_KIND: dict[Kind, tuple[str, ...]] = {
    Kind.TRANSACTION: ("transaction_id",),
    Kind.LABEL: ("transaction_id", "is_fraud", "reported_at"),
}
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_NULL = np.uint64(0x9E3779B97F4A7C15)  # stands for a missing value (distinct from every hashed one)
_COMBINE = np.uint64(0xBF58476D1CE4E5B9)


def _finish(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads every input bit over the word (the bucket is the top bits)."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _hash_strings(array: pa.Array) -> np.ndarray:
    """FNV-1a of each UTF-8 value, rows sorted by length so each byte position is one numpy step over
    the rows still that long (cost: total bytes, whatever the longest value)."""
    array = pc.cast(array, pa.large_string()) if not pa.types.is_large_string(array.type) else array
    n = len(array)
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64, n + 1, array.offset * 8)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    order = np.argsort(-lengths, kind="stable")
    sorted_starts, sorted_lengths = starts[order], lengths[order]
    h = np.full(n, _FNV_OFFSET, np.uint64)
    for j in range(int(sorted_lengths[0]) if n else 0):
        k = int(np.searchsorted(-sorted_lengths, -j, side="left"))  # rows longer than j: a prefix
        h[:k] = (h[:k] ^ data[sorted_starts[:k] + j].astype(np.uint64)) * _FNV_PRIME
    out = np.empty(n, np.uint64)
    out[order] = _finish(h ^ sorted_lengths.astype(np.uint64))
    return out


def _is_text(array: pa.Array) -> bool:
    return pa.types.is_string(array.type) or pa.types.is_large_string(array.type)


def _hash_values(array: pa.Array) -> np.ndarray:
    """The hash of each non-text value (nulls not yet marked)."""
    if pa.types.is_floating(array.type):
        values = pc.fill_null(array, 0.0).to_numpy(zero_copy_only=False).astype(np.float64) + 0.0  # -0.0 -> 0.0
        return _finish(values.view(np.uint64))
    # ints, booleans, timestamps, dates: their integer value
    as_int = pc.cast(array, pa.int64()) if not pa.types.is_boolean(array.type) else pc.cast(array, pa.int8())
    return _finish(pc.fill_null(as_int, 0).to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64))


def _hash_arrays(arrays: list[pa.Array]) -> list[np.ndarray]:
    """Each array's value hashes. The text arrays are hashed as one (one numpy step per byte
    position over all of them, not per column: a batch of a few hundred rows is step-bound)."""
    hashes: list[np.ndarray | None] = [None if _is_text(a) else _hash_values(a) for a in arrays]
    text = [i for i, a in enumerate(arrays) if _is_text(a)]
    if text:
        joined = pa.concat_arrays([pc.cast(pc.fill_null(arrays[i], ""), pa.large_string()) for i in text])
        for i, part in zip(text, np.split(_hash_strings(joined), len(text)), strict=True):
            hashes[i] = part
    for i, array in enumerate(arrays):
        if array.null_count:
            hashes[i] = np.where(array.is_null().to_numpy(zero_copy_only=False), _NULL, hashes[i])
    return hashes


def hash_columns(table: pa.Table, columns: tuple[str, ...] | list[str]) -> np.ndarray:
    """One uint64 per row over ``columns`` in order (order matters; nulls hash apart from values)."""
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in (table[n] for n in columns)]
    h = np.full(table.num_rows, _FNV_OFFSET, np.uint64)
    for column_hash in _hash_arrays(arrays):
        h = _finish((h * _COMBINE) ^ column_hash)
    return h


def identity_hashes(table: pa.Table, kind: Kind) -> np.ndarray:
    return hash_columns(table, IDENTITY_BY_KIND[kind])


def content_hashes(table: pa.Table, kind: Kind) -> np.ndarray:
    return hash_columns(table, [s.name for s in FIELDS_BY_KIND[kind]])


class RowHashes:
    """The hashes of one batch's rows, each computed at most once and only for the rows asked for:
    the read tasks look every row's identity up, but hash content only for copies and for events
    quarantined for their timing, and a night with an empty index hashes nothing it does not keep."""

    def __init__(self, table: pa.Table, kind: Kind) -> None:
        self.table, self.kind = table, kind
        n = table.num_rows
        self._values = {"identity": np.zeros(n, np.uint64), "content": np.zeros(n, np.uint64)}
        self._known = {"identity": np.zeros(n, bool), "content": np.zeros(n, bool)}

    def identities(self, rows: np.ndarray) -> np.ndarray:
        return self._of("identity", IDENTITY_BY_KIND[self.kind], rows)

    def contents(self, rows: np.ndarray) -> np.ndarray:
        return self._of("content", [s.name for s in FIELDS_BY_KIND[self.kind]], rows)

    def _of(self, which: str, columns: tuple[str, ...] | list[str], rows: np.ndarray) -> np.ndarray:
        values, known = self._values[which], self._known[which]
        missing = rows[~known[rows]]
        if len(missing):
            needed = self.table.select(list(columns))  # only the hashed columns, never the payload
            if len(missing) < self.table.num_rows:
                needed = needed.take(pa.array(missing))
            values[missing], known[missing] = hash_columns(needed, columns), True
        return values[rows]


def transaction_id_hashes(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The transaction identity hash of bare ids (a label's ``transaction_id``)."""
    return hash_columns(pa.table({"transaction_id": ids}), IDENTITY_BY_KIND[Kind.TRANSACTION])


def as_int64(hashes: np.ndarray) -> pa.Array:
    """uint64 hashes stored as Parquet int64 (the bits unchanged; Spark has no unsigned type)."""
    return pa.array(hashes.view(np.int64), pa.int64())


def from_int64(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
