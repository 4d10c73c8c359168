"""Arrow validation: same verdict as the contract's ``validate_event`` on every record, with the
fast path deciding the ordinary ones."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from pipeline.contract import FIELDS_BY_KIND, Kind, parse_rfc3339, validate_event
from pipeline.ingest.classify import classify_records
from pipeline.ingest.validate import DETAIL, FIELD, REASON, ROUTED, validate_values
from tests.ingest.corpus import GOOD_LABEL, GOOD_TX, LABEL_CORPUS, TX_CORPUS, python_reasons


def verdicts(values: list[bytes], kind: Kind) -> list[tuple]:
    out = validate_values(pa.array(values, pa.binary()), kind)
    return list(zip(out[REASON].to_pylist(), out[FIELD].to_pylist(), strict=True))


@pytest.mark.parametrize("kind,corpus", [(Kind.TRANSACTION, TX_CORPUS), (Kind.LABEL, LABEL_CORPUS)])
def test_every_record_gets_the_contract_reason_in_one_batch(kind, corpus):
    assert verdicts(corpus, kind) == python_reasons(corpus, kind)


@pytest.mark.parametrize("kind,corpus", [(Kind.TRANSACTION, TX_CORPUS), (Kind.LABEL, LABEL_CORPUS)])
def test_every_record_gets_the_contract_reason_alone(kind, corpus):
    # One record per batch: the fast path sees each well-formed object on its own.
    assert [verdicts([v], kind)[0] for v in corpus] == python_reasons(corpus, kind)


@pytest.mark.parametrize("kind,corpus", [(Kind.TRANSACTION, TX_CORPUS), (Kind.LABEL, LABEL_CORPUS)])
def test_rejected_records_carry_the_contract_detail(kind, corpus):
    out = validate_values(pa.array(corpus, pa.binary()), kind)
    expected = [rejection.detail if rejection else None for _, rejection in (validate_event(v, kind) for v in corpus)]
    assert out[DETAIL].to_pylist() == expected


def test_fast_path_accepts_canonical_records_without_the_contract_loop():
    # Amounts from 0 up: zero-amount authorisations (card verification) are ordinary traffic.
    amounts = [0, -0.0, *range(2, 500)]
    records = [json.dumps({**GOOD_TX, "transaction_id": f"t-{i}", "amount": a}).encode() for i, a in enumerate(amounts)]
    out = validate_values(pa.array(records, pa.binary()), Kind.TRANSACTION)
    assert out[REASON].null_count == 500
    assert not any(out[ROUTED].to_pylist())
    assert out["amount"].to_pylist() == [float(a) for a in amounts]


@pytest.mark.parametrize("bad,reason", [
    (b"{broken", "malformed_json"),
    (json.dumps(GOOD_TX).encode()[:-1] + b', "note": "\xff"}', "malformed_json"),  # not UTF-8, in an extra field
    (json.dumps({**GOOD_TX, "amount": -0.5}).encode(), "negative_amount"),
])
def test_one_bad_record_does_not_push_its_block_onto_the_slow_path(bad, reason):
    records = [json.dumps({**GOOD_TX, "transaction_id": f"t-{i}"}).encode() for i in range(1000)]
    records[437] = bad
    out = validate_values(pa.array(records, pa.binary()), Kind.TRANSACTION)
    assert out[REASON].to_pylist()[437] == reason
    assert out[REASON].null_count == 999
    assert sum(out[ROUTED].to_pylist()) <= 16  # only the bisected block around it


def _mutations(rng: random.Random, base: dict, kind: Kind) -> bytes:
    obj = dict(base)
    specs = FIELDS_BY_KIND[kind]
    for _ in range(rng.randint(1, 3)):
        name = rng.choice([s.name for s in specs] + ["extra"])
        choice = rng.random()
        if choice < 0.2:
            obj.pop(name, None)
        else:
            obj[name] = rng.choice([None, "", " ", "EUR", "eur", "5411", "54110", "DE", "de", 0, -1, 1, 1.5, 2,
                                    True, "2026-02-30T00:00:00Z", "2026-01-05T10:00:00.1234567Z",
                                    "2026-01-05T10:00:00+05:00", "2026-01-05T10:00:00Z", "t-x", [1], {"a": 1},
                                    "\u00a0", "٢٠٢٦-01-05T10:00:00Z", 1e308, float("inf"), 0.0, -0.0, -1e-9,
                                    "\ud800", "t-\udfff"])
    text = json.dumps(obj)
    if rng.random() < 0.1:
        text = text.replace('"amount"', '"amount": 1, "amount"', 1)  # duplicate key
    if rng.random() < 0.05:
        text = " " + text + "\n"
    raw = text.encode()
    if rng.random() < 0.05:  # bytes that are not UTF-8, in a contract field or an extra one
        raw = rng.choice([raw.replace(b'"EUR"', b'"E\xc3R"'), raw.replace(b'"t-1"', b'"t-\xff"'),
                          raw[:-1] + b', "note": "\xe2\x82"}'])
    return raw


@pytest.mark.parametrize("kind,base", [(Kind.TRANSACTION, GOOD_TX), (Kind.LABEL, GOOD_LABEL)])
def test_randomly_mutated_records_get_the_contract_verdict_and_values(kind, base):
    rng = random.Random(20261130)
    records = [_mutations(rng, base, kind) for _ in range(3000)]
    out = validate_values(pa.array(records, pa.binary()), kind)
    expected = python_reasons(records, kind)
    assert verdicts(records, kind) == expected
    assert sum(r is None for r, _ in expected) > 100  # the corpus does exercise acceptance
    rows = out.to_pylist()
    for raw, row in zip(records, rows, strict=True):
        record, rejection = validate_event(raw, kind)
        if rejection is None:
            for spec in FIELDS_BY_KIND[kind]:
                want = record.get(spec.name)
                if want is not None and spec.json_type == "timestamp":
                    want = parse_rfc3339(want)
                assert row[spec.name] == want, (raw, spec.name)


@pytest.mark.spark
def test_spark_path_classifies_like_the_contract(spark):
    rows = [("t", 0, i, None, None, value) for i, value in enumerate(TX_CORPUS)]
    df = spark.createDataFrame(rows, "topic string, partition int, offset long, timestamp timestamp, "
                                     "key binary, value binary")
    out = classify_records(df, Kind.TRANSACTION).orderBy("offset").select(REASON, FIELD).collect()
    assert [(r[REASON], r[FIELD]) for r in out] == python_reasons(TX_CORPUS, Kind.TRANSACTION)


def test_out_of_range_times_and_amounts_get_the_contract_reasons():
    # A UTC year below 1 and a 400-digit amount: neither fits the fast path's types.
    records = [json.dumps({**GOOD_TX, "event_time": "0001-01-01T00:30:00+01:00"}).encode(),
               json.dumps({**GOOD_TX, "amount": 10**400}).encode()]
    out = validate_values(pa.array(records, pa.binary()), Kind.TRANSACTION)
    assert out[REASON].to_pylist() == ["bad_time", "non_finite_amount"]


@pytest.mark.parametrize("kind,corpus", [(Kind.TRANSACTION, TX_CORPUS), (Kind.LABEL, LABEL_CORPUS)])
def test_a_slice_whose_neighbours_hold_line_breaks_gets_the_contract_reasons(kind, corpus):
    # The line-break screen reads the array's whole data buffer: a break outside the slice only
    # sends the slice to the per-value search, and the verdicts stay the contract's.
    clean = [v for v in corpus if b"\n" not in v and b"\r" not in v]
    padded = pa.array([b'{"pretty":\n1}', *clean, b'{"crlf":\r\n2}'], pa.binary())
    out = validate_values(padded.slice(1, len(clean)), kind)
    assert list(zip(out[REASON].to_pylist(), out[FIELD].to_pylist(), strict=True)) == python_reasons(clean, kind)


def test_records_with_line_breaks_between_tokens_take_the_contract_path():
    good = json.dumps({**GOOD_TX, "transaction_id": "t-pretty"}, indent=1).encode()
    records = [json.dumps({**GOOD_TX, "transaction_id": f"t-{i}"}).encode() for i in range(100)] + [good]
    out = validate_values(pa.array(records, pa.binary()), Kind.TRANSACTION)
    assert out[REASON].null_count == len(records)  # valid to the contract, as json.loads reads it
    assert out[ROUTED].to_pylist() == [False] * 100 + [True]
