"""Records covering every contract RejectReason, valid variants and parser edge cases."""

from __future__ import annotations

import json

from pipeline.contract import Kind, validate_event

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
    # zero amounts (card verification, card testing) are valid; 1e-400 reads as 0.0
    tx(amount=0), tx(amount=0.0), tx(amount=-0.0), tx().replace(b'"amount": 12.5', b'"amount": -0'),
    tx(amount=1e-400), tx().replace(b'"amount": 12.5', b'"amount": -0e3'),
    tx(note="\udc00"),  # a lone surrogate outside the contract's fields is kept, like any extra field
    # MALFORMED_JSON
    b"{not json", b"", b"\xff\xfe{}", '\ufeff{"a":1}'.encode(), tx()[:-1], tx() + b" trailing", tx() + tx(),
    b'{"amount": 1,}', b'{"a":"x\ty"}',
    # ... not UTF-8 inside an otherwise valid object: in an extra field and in contract fields
    tx()[:-1] + b', "note": "\xff\xfe"}', tx().replace(b'"d-1"', b'"d-\xc3"'), tx().replace(b'"EUR"', b'"E\x80R"'),
    # ... a \u escape of a lone surrogate in a contract field
    tx(device_id="\ud800"), tx(card_id="c\udfff"),
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
    # NEGATIVE_AMOUNT / NON_FINITE_AMOUNT
    tx(amount=-3.2), tx(amount=-0.01), tx(amount=-5e-324),
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
    label()[:-1] + b', "note": "\xe2\x82"}', label().replace(b'"chargeback"', b'"charge\xffback"'),
    label(source="\ud83d"), label(note="\ud83d"),
]


def python_reasons(corpus: list[bytes], kind: Kind) -> list[tuple]:
    """(reason, field) per record from the contract itself."""
    out = []
    for value in corpus:
        _, rejection = validate_event(value, kind)
        out.append((rejection.reason.value, rejection.field) if rejection else (None, None))
    return out
