"""Every rejection reason of the event contract, and what valid records keep."""

from __future__ import annotations

import json

import pytest

from pipeline.contract import (
    Kind,
    RejectReason,
    detect_kind,
    event_key,
    format_rfc3339,
    parse_rfc3339,
    validate_event,
)

GOOD_TX = {
    "schema_version": 1,
    "transaction_id": "tx-1",
    "event_time": "2026-03-01T12:00:00.250Z",
    "card_id": "card-9",
    "merchant_id": "m-3",
    "amount": 42.5,
    "currency": "EUR",
    "mcc": "5411",
    "channel": "ecommerce",
    "country": "DE",
    "device_id": "dev-1",
}
GOOD_LABEL = {
    "schema_version": 1,
    "transaction_id": "tx-1",
    "is_fraud": True,
    "reported_at": "2026-03-05T08:00:00+02:00",
    "source": "chargeback",
}


def _tx(**changes):
    obj = dict(GOOD_TX)
    for k, v in changes.items():
        if v is _DROP:
            obj.pop(k)
        else:
            obj[k] = v
    return json.dumps(obj)


_DROP = object()


def test_valid_transaction_and_label_pass_and_keep_unknown_fields():
    record, rejection = validate_event(json.dumps({**GOOD_TX, "risk_hint": "x"}), Kind.TRANSACTION)
    assert rejection is None
    assert record["risk_hint"] == "x" and record["amount"] == 42.5
    record, rejection = validate_event(json.dumps(GOOD_LABEL).encode(), Kind.LABEL)
    assert rejection is None and record["is_fraud"] is True


@pytest.mark.parametrize("amount", [b"0", b"0.0", b"-0.0", b"-0", b"0e5", b"0.01"])
def test_zero_amounts_are_valid(amount):
    # Card verifications and card-testing probes are real zero-amount authorisations.
    raw = _tx(amount=12.5).replace('"amount": 12.5', '"amount": ' + amount.decode())
    record, rejection = validate_event(raw.encode(), Kind.TRANSACTION)
    assert rejection is None and record["amount"] == float(amount)


def test_lone_surrogates_outside_the_contract_fields_are_kept():
    record, rejection = validate_event(_tx(note="\udc00"), Kind.TRANSACTION)
    assert rejection is None and record["note"] == "\udc00"


def test_optional_fields_may_be_absent_or_null():
    raw = _tx(mcc=_DROP, channel=None, country=_DROP, device_id=_DROP)
    assert validate_event(raw, Kind.TRANSACTION)[1] is None


@pytest.mark.parametrize(
    ("raw", "reason", "field"),
    [
        (b"{not json", RejectReason.MALFORMED_JSON, None),
        (b"\xff\xfe\x00garbage", RejectReason.MALFORMED_JSON, None),
        ("[1, 2]", RejectReason.NOT_AN_OBJECT, None),
        ("[" * 100_000 + "]" * 100_000, RejectReason.MALFORMED_JSON, None),  # nesting beyond the recursion limit
        (_tx(schema_version=_DROP), RejectReason.MISSING_FIELD, "schema_version"),
        (_tx(schema_version="1"), RejectReason.WRONG_TYPE, "schema_version"),
        (_tx(schema_version=2), RejectReason.UNKNOWN_SCHEMA_VERSION, "schema_version"),
        (_tx(card_id=_DROP), RejectReason.MISSING_FIELD, "card_id"),
        (_tx(amount="12.00"), RejectReason.WRONG_TYPE, "amount"),
        (_tx(amount=True), RejectReason.WRONG_TYPE, "amount"),
        (_tx(card_id=123), RejectReason.WRONG_TYPE, "card_id"),
        (_tx(device_id="\ud800"), RejectReason.MALFORMED_JSON, "device_id"),  # escape of a lone surrogate
        (_tx(event_time="2026-03-01T12:00:00\udfffZ"), RejectReason.MALFORMED_JSON, "event_time"),
        (_tx(transaction_id="  "), RejectReason.EMPTY_ID, "transaction_id"),
        (_tx(amount=-3.2), RejectReason.NEGATIVE_AMOUNT, "amount"),
        (_tx(amount=-0.01), RejectReason.NEGATIVE_AMOUNT, "amount"),
        (_tx(amount=-(10**30)), RejectReason.NEGATIVE_AMOUNT, "amount"),
        (_tx(amount=float("nan")), RejectReason.NON_FINITE_AMOUNT, "amount"),
        (_tx(amount=float("inf")), RejectReason.NON_FINITE_AMOUNT, "amount"),
        (_tx(amount=10**400), RejectReason.NON_FINITE_AMOUNT, "amount"),
        (_tx(currency="euro"), RejectReason.BAD_CURRENCY, "currency"),
        (_tx(event_time="2026-03-01 12:00"), RejectReason.BAD_TIME, "event_time"),
        (_tx(event_time="2026-03-01T12:00:00"), RejectReason.BAD_TIME, "event_time"),  # no offset
        (_tx(event_time="2026-13-45T12:00:00Z"), RejectReason.BAD_TIME, "event_time"),
        (_tx(event_time="0001-01-01T00:30:00+01:00"), RejectReason.BAD_TIME, "event_time"),  # UTC year 0
        (_tx(mcc="54"), RejectReason.BAD_MCC, "mcc"),
        (_tx(country="DEU"), RejectReason.BAD_COUNTRY, "country"),
    ],
)
def test_each_rejection_reason_is_named(raw, reason, field):
    record, rejection = validate_event(raw, Kind.TRANSACTION)
    assert record is None
    assert rejection.reason is reason
    assert rejection.field == field
    assert rejection.detail  # an operator-readable explanation


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"is_fraud": "yes"}, RejectReason.WRONG_TYPE),
        ({"is_fraud": None}, RejectReason.MISSING_FIELD),
        ({"reported_at": "yesterday"}, RejectReason.BAD_TIME),
        ({"transaction_id": ""}, RejectReason.EMPTY_ID),
    ],
)
def test_label_rejections(changes, reason):
    _, rejection = validate_event(json.dumps({**GOOD_LABEL, **changes}), Kind.LABEL)
    assert rejection.reason is reason


def test_rfc3339_round_trip_is_utc():
    ts = parse_rfc3339("2026-03-05T08:00:00.123456789+02:00")
    assert ts.utcoffset().total_seconds() == 0
    assert format_rfc3339(ts) == "2026-03-05T06:00:00.123Z"


def test_keys_and_kind_detection_follow_the_contract():
    assert event_key(GOOD_TX, Kind.TRANSACTION) == b"card-9"
    assert event_key(GOOD_LABEL, Kind.LABEL) == b"tx-1"
    assert detect_kind(GOOD_TX) is Kind.TRANSACTION
    assert detect_kind(GOOD_LABEL) is Kind.LABEL
    assert detect_kind({"foo": 1}) is None


def test_an_integer_too_long_to_parse_is_malformed_json_not_an_exception():
    record, rejection = validate_event(b'{"schema_version": 1, "amount": ' + b"9" * 5000 + b"}", Kind.TRANSACTION)
    assert record is None and rejection.reason is RejectReason.MALFORMED_JSON
