"""Identity and content hashes: stable across runs and libraries, typed, null-aware."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.contract import Kind
from pipeline.ingest.identity import (
    as_int64,
    content_hashes,
    from_int64,
    hash_columns,
    identity_hashes,
    transaction_id_hashes,
)
from pipeline.ingest.validate import validate_values
from tests.ingest.corpus import tx

TS = pa.timestamp("us", tz="UTC")


def test_fnv1a_of_strings_is_the_published_function_before_the_finish():
    # FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (the reference vector); the column hash finishes it
    # with the value's length folded in, so equal strings hash equal and different ones apart.
    from pipeline.ingest.identity import _finish, _hash_strings

    expected = _finish(np.array([0xAF63DC4C8601EC8C ^ 1], np.uint64))
    assert _hash_strings(pa.array(["a"]))[0] == expected[0]


def test_stored_hashes_never_change_text_numbers_and_nulls_mixed():
    # The identity index keeps these hashes for the whole history: a change of the function (here,
    # hashing a batch's text columns in one pass) must give the values stores already hold.
    t = pa.table({"id": ["tx-1", "tx-22", None], "amount": [12.5, None, -0.0], "merchant": ["m-7", "", "m-9"],
                  "n": pa.array([3, None, 5], pa.int64())})
    assert [hex(int(v)) for v in hash_columns(t, ["id", "amount", "merchant", "n"])] == \
        ["0xca7cf630c69f7da3", "0x9dc22d9337683fb7", "0xee615d482df72d57"]


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
    h = hash_columns(pa.table({"c": [f"tx-{i}" for i in range(16_000)]}), ["c"])
    buckets = np.bincount((h >> np.uint64(60)).astype(np.int64), minlength=16)
    assert buckets.min() > 800 and buckets.max() < 1200
