"""Identity and content hashes: stable across runs and libraries, typed, null-aware."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.contract import Kind
from pipeline.ingest.identity import (
    IDENTITY,
    as_int64,
    content_hashes,
    from_int64,
    hash_columns,
    identity_hashes,
    identity_of,
    transaction_id_hashes,
)
from pipeline.ingest.validate import validate_values
from tests.ingest.corpus import tx

TS = pa.timestamp("us", tz="UTC")


M64 = 2**64 - 1
PINNED_H1 = ["0xd1593541a2a341f3", "0x5d6db44c6fd1272c", "0xaca4ce5dbad90b33"]
PINNED_H2 = ["0x2fe841d707f4cd7d", "0x8d8f44d254d556a7", "0x225d5c361263ad57"]


def _oracle_mix(lane: int, h: int) -> int:
    """The two published 64-bit finalisers, in plain integers (splitmix64's, murmur3's fmix64)."""
    if lane == 0:
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & M64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & M64
        return h ^ (h >> 31)
    h = ((h ^ (h >> 33)) * 0xFF51AFD7ED558CCD) & M64
    h = ((h ^ (h >> 33)) * 0xC4CEB9FE1A85EC53) & M64
    return h ^ (h >> 33)


def _oracle_string(lane: int, text: str) -> int:
    """The string hash as the module doc defines it, one value at a time: each 8-byte little-endian
    word (zero-padded) mixed in, then the byte length."""
    data = text.encode()
    h = (0xCBF29CE484222325, 0x6A09E667F3BCC909)[lane]
    for at in range(0, len(data), 8):
        h = _oracle_mix(lane, h ^ int.from_bytes(data[at:at + 8], "little"))
    return _oracle_mix(lane, h ^ len(data))


def test_string_hashes_equal_the_definition_computed_value_by_value():
    from pipeline.ingest.identity import _hash_strings

    values = ["", "a", "ab", "ab\0", "1234567", "12345678", "123456789", "tx-20260101-8f0f85-000000001",
              "é" * 9, "x" * 40, "0123456789abcdef0"]
    for column in (pa.array(values), pa.array(values[4:5] * 3)):  # mixed lengths, and all one length
        h1, h2 = _hash_strings(column, 2)
        assert h1.tolist() == [_oracle_string(0, v) for v in column.to_pylist()]
        assert h2.tolist() == [_oracle_string(1, v) for v in column.to_pylist()]


def test_stored_hashes_never_change_text_numbers_and_nulls_mixed():
    # The identity index keeps these hashes for the whole history: a change of the function must
    # give the values stores already hold (or be a new INDEX_FORMAT, see id_index).
    t = pa.table({"id": ["tx-1", "tx-22", None], "amount": [12.5, None, -0.0], "merchant": ["m-7", "", "m-9"],
                  "n": pa.array([3, None, 5], pa.int64())})
    columns = ["id", "amount", "merchant", "n"]
    assert [hex(int(v)) for v in hash_columns(t, columns)] == PINNED_H1
    both = identity_of(t, columns)
    assert [hex(int(v)) for v in both["h1"]] == PINNED_H1 and [hex(int(v)) for v in both["h2"]] == PINNED_H2


def test_an_identity_is_128_bits_of_two_independent_lanes():
    ids = transaction_id_hashes(pa.array([f"tx-{i}" for i in range(20_000)]))
    assert ids.dtype == IDENTITY and ids["h1"].tolist() == hash_columns(
        pa.table({"transaction_id": pa.array([f"tx-{i}" for i in range(20_000)])}), ["transaction_id"]).tolist()
    assert len(set(ids["h1"].tolist())) == len(set(ids["h2"].tolist())) == 20_000
    # Independent: h2 agrees with h1 on a low bit about half the time, whatever the bit.
    for bit in (0, 17, 63):
        agree = ((ids["h1"] >> np.uint64(bit)) & np.uint64(1)) == ((ids["h2"] >> np.uint64(bit)) & np.uint64(1))
        assert 0.47 < agree.mean() < 0.53


def test_equal_values_hash_equal_whatever_the_chunking_or_string_type():
    one = pa.table({"transaction_id": ["tx-1", "tx-22", "", "tx-1"]})
    chunked = pa.table({"transaction_id": pa.chunked_array([["tx-1", "tx-22"], ["", "tx-1"]], pa.large_string())})
    a, b = hash_columns(one, ["transaction_id"]), hash_columns(chunked, ["transaction_id"])
    assert a.tolist() == b.tolist()
    assert a[0] == a[3] and len(set(a[:3].tolist())) == 3


def test_sliced_arrays_hash_their_own_values():
    column = pa.array(["x", "yy", "zzz", "x"])
    assert hash_columns(pa.table({"c": column.slice(1, 3)}), ["c"]).tolist() == \
        hash_columns(pa.table({"c": pa.array(["yy", "zzz", "x"])}), ["c"]).tolist()


def test_null_differs_from_empty_and_zero_and_column_order_matters():
    strings = hash_columns(pa.table({"c": pa.array(["", None])}), ["c"])
    numbers = hash_columns(pa.table({"c": pa.array([0.0, None, -0.0])}), ["c"])
    assert strings[0] != strings[1] and numbers[0] != numbers[1] and numbers[0] == numbers[2]
    t = pa.table({"a": ["p", "q"], "b": ["q", "p"]})
    ab, ba = hash_columns(t, ["a", "b"]), hash_columns(t, ["b", "a"])
    assert ab[0] != ab[1] and ab[0] == ba[1]


def test_a_transaction_identity_is_its_id_and_its_content_every_typed_field():
    table = validate_values(pa.array([tx(transaction_id=f"t-{i}") for i in range(3)], pa.binary()), Kind.TRANSACTION)
    ids = identity_hashes(table, Kind.TRANSACTION)
    assert ids.tolist() == transaction_id_hashes(table["transaction_id"]).tolist()
    changed = table.set_column(table.schema.get_field_index("amount"), "amount",
                               pa.array([table["amount"][0].as_py() + 0.01] + table["amount"].to_pylist()[1:]))
    assert identity_hashes(changed, Kind.TRANSACTION).tolist() == ids.tolist()
    before, after = content_hashes(table, Kind.TRANSACTION), content_hashes(changed, Kind.TRANSACTION)
    assert before[0] != after[0] and before[1:].tolist() == after[1:].tolist()


def test_a_label_identity_is_the_payment_the_verdict_and_the_report_time():
    t = pa.table({"transaction_id": ["t1", "t1", "t1"], "is_fraud": [True, False, True],
                  "reported_at": pa.array([100, 100, 200], pa.int64()).cast(TS)})
    assert len(set(hash_columns(t, ["transaction_id", "is_fraud", "reported_at"]).tolist())) == 3


def test_hashes_survive_a_trip_through_parquet_int64():
    h = np.array([0, 1, 2**63, 2**64 - 1], np.uint64)
    assert from_int64(as_int64(h)).tolist() == h.tolist()


def test_the_top_bits_spread_so_buckets_fill_evenly():
    h = identity_of(pa.table({"c": [f"tx-{i}" for i in range(16_000)]}), ["c"])["h1"]
    buckets = np.bincount((h >> np.uint64(60)).astype(np.int64), minlength=16)
    assert buckets.min() > 800 and buckets.max() < 1200
