"""What makes two records the same event, as hashes (pure numpy over Arrow buffers).

* identity: a transaction is its ``transaction_id``; a label is ``(transaction_id, is_fraud,
  reported_at)``, since several reports for one payment are legitimate (a fraud report, then a
  clearing review). Two records with one identity are copies of one event.
* content: every contract field, typed (formatting of the JSON text and unknown fields are not
  compared). Two copies with equal content are an identical resend (``DUPLICATE``); with different
  content, a ``CONFLICTING_DUPLICATE``.

An identity hash is 128 bits (:data:`IDENTITY`: two independent 64-bit lanes), because a collision
would quarantine a real payment as a copy of another: with 9e8 stored ids (10 M a day for 90 days)
64 bits collide somewhere with a chance of about 2%, 128 bits with about 1e-21. A content hash is
compared only between copies of one identity, so 64 bits (lane ``h1``) are plenty.

The hashes are this module's own, so they never change with a library upgrade: the identity index
(:mod:`pipeline.ingest.id_index`) keeps them for the whole history, and a change of any value here
is a change of its format (``INDEX_FORMAT`` there). Each lane reads a string 8 bytes at a time
(little-endian words, zero-padded) and mixes every word with its own 64-bit finaliser (lane 1:
splitmix64's, lane 2: murmur3's ``fmix64``), so a batch costs one numpy step per 8 bytes of its
longest value. A transaction's identity hash is the hash of its ``transaction_id`` alone, so a
label's ``transaction_id`` can be looked up among transactions with the same function
(:func:`transaction_id_hashes`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract import FIELDS_BY_KIND, Kind

IDENTITY_BY_KIND: dict[Kind, tuple[str, ...]] = {
    Kind.TRANSACTION: ("transaction_id",),
    Kind.LABEL: ("transaction_id", "is_fraud", "reported_at"),
}
IDENTITY = np.dtype([("h1", "<u8"), ("h2", "<u8")])  # one 128-bit identity hash; h1 orders the index
_SEEDS = (np.uint64(0xCBF29CE484222325), np.uint64(0x6A09E667F3BCC909))
_NULLS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBB67AE8584CAA73B))  # a missing value, per lane
_COMBINE = np.uint64(0xBF58476D1CE4E5B9)
# Word masks by the bytes a value still has in its last word (little-endian: the low bytes).
_TAIL_MASKS = np.array([(1 << (8 * i)) - 1 for i in range(8)] + [2**64 - 1], np.uint64)


def _splitmix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (lane 1): spreads every input bit over the word (the bucket is the top bits)."""
    h = h ^ (h >> np.uint64(30))
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return h


def _fmix64(h: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finaliser (lane 2): other constants and shifts than lane 1's."""
    h = h ^ (h >> np.uint64(33))
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


_MIXERS: tuple[Callable[[np.ndarray], np.ndarray], ...] = (_splitmix, _fmix64)


def _words(data: np.ndarray) -> np.ndarray:
    """A little-endian uint64 view starting at every byte of ``data`` (zero past its end)."""
    padded = np.zeros(len(data) + 8, np.uint8)
    padded[:len(data)] = data
    return np.ndarray((len(data) + 1,), np.dtype("<u8"), padded, strides=(1,))


def _hash_strings(array: pa.Array, lanes: int) -> list[np.ndarray]:
    """Each UTF-8 value's hash in the first ``lanes`` lanes. Rows are taken longest first, so each
    8-byte word position is one numpy step over the rows still that long (cost: total bytes / 8)."""
    array = pc.cast(array, pa.large_string()) if not pa.types.is_large_string(array.type) else array
    n = len(array)
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64, n + 1, array.offset * 8)
    words = _words(np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8))
    starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
    uniform = n == 0 or lengths.min() == lengths.max()  # fixed-format ids: no reordering
    order = None if uniform else np.argsort(-lengths, kind="stable")
    if order is not None:
        starts, lengths = starts[order], lengths[order]
    hashes = [np.full(n, _SEEDS[lane], np.uint64) for lane in range(lanes)]
    for at in range(0, int(lengths[0]) if n else 0, 8):
        rows = n if uniform else int(np.searchsorted(-lengths, -at, side="left"))  # longer than ``at``: a prefix
        word = words[starts[:rows] + at]
        if at + 8 > lengths[rows - 1]:  # some of these rows end inside this word
            word &= _TAIL_MASKS[np.minimum(lengths[:rows] - at, 8)]
        for lane, h in enumerate(hashes):
            h[:rows] = _MIXERS[lane](h[:rows] ^ word)
    out = []
    for lane, h in enumerate(hashes):
        finished = _MIXERS[lane](h ^ lengths.astype(np.uint64))  # "ab" and "ab\0" pad to one word
        if order is not None:
            finished[order] = finished.copy()
        out.append(finished)
    return out


def _is_text(array: pa.Array) -> bool:
    return pa.types.is_string(array.type) or pa.types.is_large_string(array.type)


def _value_bits(array: pa.Array) -> np.ndarray:
    """The 64 bits each non-text value is hashed from (nulls not yet marked)."""
    if pa.types.is_floating(array.type):
        values = pc.fill_null(array, 0.0).to_numpy(zero_copy_only=False).astype(np.float64) + 0.0  # -0.0 -> 0.0
        return values.view(np.uint64)
    # ints, booleans, timestamps, dates: their integer value
    as_int = pc.cast(array, pa.int64()) if not pa.types.is_boolean(array.type) else pc.cast(array, pa.int8())
    return pc.fill_null(as_int, 0).to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)


def _hash_arrays(arrays: list[pa.Array], lanes: int) -> list[list[np.ndarray]]:
    """Per lane, each array's value hashes. The text arrays are hashed as one (one numpy step per
    word position over all of them, not per column: a batch of a few thousand rows is step-bound)."""
    hashes: list[list[np.ndarray | None]] = [[None] * len(arrays) for _ in range(lanes)]
    for i, array in enumerate(arrays):
        if not _is_text(array):
            bits = _value_bits(array)
            for lane in range(lanes):
                hashes[lane][i] = _MIXERS[lane](bits)
    text = [i for i, a in enumerate(arrays) if _is_text(a)]
    if text:
        joined = pa.concat_arrays([pc.cast(pc.fill_null(arrays[i], ""), pa.large_string()) for i in text])
        for lane, lane_hashes in enumerate(_hash_strings(joined, lanes)):
            for i, part in zip(text, np.split(lane_hashes, len(text)), strict=True):
                hashes[lane][i] = part
    for i, array in enumerate(arrays):
        if array.null_count:
            missing = array.is_null().to_numpy(zero_copy_only=False)
            for lane in range(lanes):
                hashes[lane][i] = np.where(missing, _NULLS[lane], hashes[lane][i])
    return hashes


def _hash_lanes(table: pa.Table, columns: tuple[str, ...] | list[str], lanes: int) -> list[np.ndarray]:
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in (table[n] for n in columns)]
    out = []
    for lane, column_hashes in enumerate(_hash_arrays(arrays, lanes)):
        h = np.full(table.num_rows, _SEEDS[lane], np.uint64)
        for column_hash in column_hashes:
            h = _MIXERS[lane]((h * _COMBINE) ^ column_hash)
        out.append(h)
    return out


def hash_columns(table: pa.Table, columns: tuple[str, ...] | list[str]) -> np.ndarray:
    """One uint64 per row over ``columns`` in order (order matters; nulls hash apart from values)."""
    return _hash_lanes(table, columns, 1)[0]


def identity_of(table: pa.Table, columns: tuple[str, ...] | list[str]) -> np.ndarray:
    """One :data:`IDENTITY` per row over ``columns``: :func:`hash_columns` as ``h1`` and an
    independent lane as ``h2``."""
    h1, h2 = _hash_lanes(table, columns, 2)
    out = np.empty(table.num_rows, IDENTITY)
    out["h1"], out["h2"] = h1, h2
    return out


def identity_hashes(table: pa.Table, kind: Kind) -> np.ndarray:
    return identity_of(table, IDENTITY_BY_KIND[kind])


def content_hashes(table: pa.Table, kind: Kind) -> np.ndarray:
    return hash_columns(table, [s.name for s in FIELDS_BY_KIND[kind]])


class RowHashes:
    """The hashes of one batch's rows, each computed at most once and only for the rows asked for:
    the read tasks look every row's identity up, but hash content only for copies and for events
    quarantined for their timing, and a night with an empty index hashes nothing it does not keep."""

    def __init__(self, table: pa.Table, kind: Kind) -> None:
        self.table, self.kind = table, kind
        n = table.num_rows
        self._values = {"identity": np.zeros(n, IDENTITY), "content": np.zeros(n, np.uint64)}
        self._known = {"identity": np.zeros(n, bool), "content": np.zeros(n, bool)}

    def identities(self, rows: np.ndarray) -> np.ndarray:
        return self._of("identity", rows)

    def contents(self, rows: np.ndarray) -> np.ndarray:
        return self._of("content", rows)

    def _of(self, which: str, rows: np.ndarray) -> np.ndarray:
        values, known = self._values[which], self._known[which]
        missing = rows[~known[rows]]
        if len(missing):
            hashed = identity_hashes if which == "identity" else content_hashes
            columns = IDENTITY_BY_KIND[self.kind] if which == "identity" else [s.name for s in FIELDS_BY_KIND[self.kind]]
            needed = self.table.select(list(columns))  # only the hashed columns, never the payload
            if len(missing) < self.table.num_rows:
                needed = needed.take(pa.array(missing))
            values[missing], known[missing] = hashed(needed, self.kind), True
        return values[rows]


def transaction_id_hashes(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The transaction identity hash of bare ids (a label's ``transaction_id``)."""
    return identity_of(pa.table({"transaction_id": ids}), IDENTITY_BY_KIND[Kind.TRANSACTION])


def as_int64(hashes: np.ndarray) -> pa.Array:
    """uint64 hashes stored as Parquet int64 (the bits unchanged; Spark has no unsigned type)."""
    return pa.array(hashes.view(np.int64), pa.int64())


def from_int64(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
