"""Parity of the Spark validation with the contract's ``validate_event`` (the one definition)."""

from __future__ import annotations

import json

import pytest

from pipeline.contract import Kind, RejectReason, validate_event
from pipeline.ingest.validate import FIELD, REASON, ROUTED, classify_records

GOOD_TX = {"schema_version": 1, "transaction_id": "t-1", "event_time": "2024-03-01T12:00:00.000Z",
           "card_id": "c-1", "merchant_id": "m-1", "amount": 12.5, "currency": "EUR", "mcc": "5411",
           "channel": "ecommerce", "country": "DE", "device_id": "d-1"}
GOOD_LABEL = {"schema_version": 1, "transaction_id": "t-1", "is_fraud": True,
              "reported_at": "2024-03-05T08:00:00Z", "source": "chargeback"}


def tx(**changes) -> bytes:
    obj = {**GOOD_TX, **changes}
    return json.dumps({k: v for k, v in obj.items() if v is not Ellipsis}).encode()


def label(**changes) -> bytes:
    obj = {**GOOD_LABEL, **changes}
    return json.dumps({k: v for k, v in obj.items() if v is not Ellipsis}).encode()


TX_CORPUS: list[bytes] = [
    tx(), tx(mcc=..., channel=..., country=..., device_id=...), tx(amount=7), tx(extra={"nested": [1, 2]}),
    tx(event_time="2024-03-01 12:00:00+02:00"), tx(event_time="2024-03-01t12:00:00.123456789z"),
    tx(mcc=None, country=None),  # JSON null on optional fields = absent
    # MALFORMED_JSON
    b"{not json", b"", b"\xff\xfe{}", '\ufeff{"a":1}'.encode(), tx()[:-1], tx() + b" trailing", tx() + tx(),
    b'{"amount": 1,}', b'{"a":"x\ty"}',
    # NOT_AN_OBJECT
    b"[1, 2]", b'"string"', b"42", b"null", b"[1] x",
    # MISSING_FIELD
    tx(schema_version=...), tx(schema_version=None), tx(transaction_id=...), tx(amount=None), tx(currency=...),
    tx(event_time=...),
    # WRONG_TYPE
    tx(schema_version="1"), tx(schema_version=1.0), tx(schema_version=True), tx(amount="12.5"), tx(amount=True),
    tx(card_id=7), tx(event_time=1709294400), tx(mcc=5411), tx(channel=["x"]), tx(device_id={"a": 1}),
    # UNKNOWN_SCHEMA_VERSION
    tx(schema_version=2), tx(schema_version=0), tx(schema_version=-1),
    # EMPTY_ID
    tx(transaction_id=""), tx(card_id="   "), tx(merchant_id="\u00a0\t"),
    # NON_POSITIVE_AMOUNT / NON_FINITE_AMOUNT
    tx(amount=0), tx(amount=-3.2), tx(amount=1e-400),
    tx().replace(b'"amount": 12.5', b'"amount": NaN'), tx().replace(b'"amount": 12.5', b'"amount": -Infinity'),
    tx().replace(b'"amount": 12.5', b'"amount": 1e400'),
    # BAD_CURRENCY / BAD_MCC / BAD_COUNTRY
    tx(currency="eur"), tx(currency="EURO"), tx(currency="EUR\r"), tx(mcc="541"), tx(mcc="54a1"),
    tx(country="DEU"), tx(country="de"),
    # BAD_TIME (regex failures in Spark; impossible dates decided by the Python fallback)
    tx(event_time="2024-03-01"), tx(event_time="2024-03-01T12:00:00"), tx(event_time="yesterday"),
    tx(event_time="2024-02-30T00:00:00Z"), tx(event_time="2024-03-01T24:00:00Z"),
    tx(event_time="0000-03-01T12:00:00Z"), tx(event_time="2024-03-01T12:00:00+19:00"),
    # first problem wins: order of fields
    tx(transaction_id="", amount=-1), tx(amount="x", currency="bad"),
    # duplicate keys: Python keeps the last value
    b'{"schema_version": 1, "schema_version": 1, "transaction_id": "t", "event_time": "2024-03-01T00:00:00Z",'
    b' "card_id": "c", "merchant_id": "m", "amount": 1, "currency": "EUR"}',
    b'{"schema_version": 1, "amount": 1, "amount": -1, "transaction_id": "t", "event_time": "2024-03-01T00:00:00Z",'
    b' "card_id": "c", "merchant_id": "m", "currency": "EUR"}',
]

LABEL_CORPUS: list[bytes] = [
    label(), label(is_fraud=False, source=...), label(is_fraud="true"), label(is_fraud=1), label(is_fraud=...),
    label(reported_at="2024-03-05"), label(transaction_id=""), label(schema_version=3), label(source=5),
    label(reported_at=None), b"[]", b"{",
]


def spark_reasons(spark, corpus: list[bytes], kind: Kind) -> list[tuple]:
    """(reason, field, decided by the Python fallback?) per record, from the Spark path."""
    rows = [("t", 0, i, None, None, value) for i, value in enumerate(corpus)]
    df = spark.createDataFrame(rows, "topic string, partition int, offset long, timestamp timestamp, "
                                     "key binary, value binary")
    out = classify_records(df, kind, diagnostics=True).orderBy("offset").select(REASON, FIELD, ROUTED).collect()
    return [(r[REASON], r[FIELD], r[ROUTED]) for r in out]


def python_reasons(corpus: list[bytes], kind: Kind) -> list[tuple]:
    out = []
    for value in corpus:
        _, rejection = validate_event(value, kind)
        out.append((rejection.reason.value, rejection.field) if rejection else (None, None))
    return out


@pytest.mark.spark
@pytest.mark.parametrize("kind,corpus", [(Kind.TRANSACTION, TX_CORPUS), (Kind.LABEL, LABEL_CORPUS)])
def test_spark_path_gives_the_contract_reason_and_field(spark, kind, corpus):
    expected = python_reasons(corpus, kind)
    got = spark_reasons(spark, corpus, kind)
    mismatches = [(c, e, g[:2]) for c, e, g in zip(corpus, expected, got, strict=True) if e != g[:2]]
    assert not mismatches
    # The vectorised expressions, not the fallback, decide the ordinary cases: every valid record and
    # every rejection that is about a field's type or value of a well-formed object.
    by_spark = {e[0] for e, g in zip(expected, got, strict=True) if not g[2]}
    assert None in by_spark
    if kind == Kind.TRANSACTION:
        assert {"missing_field", "wrong_type", "unknown_schema_version", "empty_id", "non_positive_amount",
                "non_finite_amount", "bad_currency", "bad_mcc", "bad_country", "bad_time"} <= by_spark
    routed = sum(g[2] for g in got)
    assert routed < len(corpus) / 2


def test_corpus_covers_every_contract_reason():
    seen = {r for r, _ in python_reasons(TX_CORPUS, Kind.TRANSACTION) + python_reasons(LABEL_CORPUS, Kind.LABEL)}
    ingest_only = {RejectReason.FUTURE_EVENT_TIME, RejectReason.LATE_EVENT, RejectReason.DUPLICATE}
    assert {r.value for r in RejectReason if r not in ingest_only} <= seen
    assert None in seen  # and valid records


@pytest.mark.spark
def test_valid_records_get_typed_columns(spark):
    df = spark.createDataFrame([("t", 0, 0, None, None, tx(extra=1))],
                               "topic string, partition int, offset long, timestamp timestamp, key binary, value binary")
    row = classify_records(df, Kind.TRANSACTION).first()
    assert row[REASON] is None
    assert (row.transaction_id, row.amount, row.schema_version, row.currency) == ("t-1", 12.5, 1, "EUR")
    assert row.event_time.isoformat() == "2024-03-01T12:00:00"  # session time zone is UTC
    assert json.loads(row.payload)["extra"] == 1  # unknown fields kept in the payload
