"""Event contract, version 1: the one definition of what travels on the Kafka topics.

Producer (``fraudctl produce``), simulator, Spark ingest and the scorer import the field
specs and :func:`validate_event` from here; nothing else re-declares the schema.

Topic ``transactions`` (key: ``card_id``) and topic ``fraud-labels`` (key: ``transaction_id``)
carry UTF-8 JSON objects. Unknown extra fields are kept, never fatal.
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})

TRANSACTIONS_TOPIC = "transactions"
LABELS_TOPIC = "fraud-labels"


class Kind(enum.StrEnum):
    """The two event kinds of the contract."""

    TRANSACTION = "transaction"
    LABEL = "label"


class RejectReason(enum.StrEnum):
    """Named reasons a record is rejected; stored in quarantine tables and reject files."""

    MALFORMED_JSON = "malformed_json"  # not UTF-8, not parseable JSON, or a field holding a lone surrogate (\ud800)
    NOT_AN_OBJECT = "not_an_object"  # valid JSON but not a {...} object
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
    EMPTY_ID = "empty_id"  # transaction_id / card_id / merchant_id is ""
    # Zero is a real amount (card verification, card-testing probes); only a negative one is refused.
    NEGATIVE_AMOUNT = "negative_amount"
    NON_FINITE_AMOUNT = "non_finite_amount"  # NaN / Infinity (json.loads accepts them)
    BAD_CURRENCY = "bad_currency"
    BAD_TIME = "bad_time"  # not RFC 3339 with an explicit offset
    BAD_MCC = "bad_mcc"
    BAD_COUNTRY = "bad_country"
    # Decided by ingest against its run clock, not by the record alone.
    FUTURE_EVENT_TIME = "future_event_time"
    LATE_EVENT = "late_event"
    DUPLICATE = "duplicate"  # an identical copy of an event already stored or earlier in the run
    CONFLICTING_DUPLICATE = "conflicting_duplicate"  # same identity, different content: the first copy stays


@dataclass(frozen=True)
class FieldSpec:
    """One field of an event: JSON type, whether required, and a value check."""

    name: str
    json_type: str  # "int" | "string" | "number" | "bool" | "timestamp"
    required: bool
    check: str | None = None  # name of a value rule below: "currency", "mcc", "country", "amount", "id"


TRANSACTION_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("schema_version", "int", True),
    FieldSpec("transaction_id", "string", True, "id"),
    FieldSpec("event_time", "timestamp", True),
    FieldSpec("card_id", "string", True, "id"),
    FieldSpec("merchant_id", "string", True, "id"),
    FieldSpec("amount", "number", True, "amount"),
    FieldSpec("currency", "string", True, "currency"),
    FieldSpec("mcc", "string", False, "mcc"),
    FieldSpec("channel", "string", False),
    FieldSpec("country", "string", False, "country"),
    FieldSpec("device_id", "string", False),
)

LABEL_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("schema_version", "int", True),
    FieldSpec("transaction_id", "string", True, "id"),
    FieldSpec("is_fraud", "bool", True),
    FieldSpec("reported_at", "timestamp", True),
    FieldSpec("source", "string", False),
)

FIELDS_BY_KIND: dict[Kind, tuple[FieldSpec, ...]] = {
    Kind.TRANSACTION: TRANSACTION_FIELDS,
    Kind.LABEL: LABEL_FIELDS,
}
TOPIC_BY_KIND: dict[Kind, str] = {Kind.TRANSACTION: TRANSACTIONS_TOPIC, Kind.LABEL: LABELS_TOPIC}
KEY_FIELD_BY_KIND: dict[Kind, str] = {Kind.TRANSACTION: "card_id", Kind.LABEL: "transaction_id"}
# The time that places an event in the raw store's date partitions.
TIME_FIELD_BY_KIND: dict[Kind, str] = {Kind.TRANSACTION: "event_time", Kind.LABEL: "reported_at"}

KNOWN_CHANNELS = ("card_present", "ecommerce", "atm", "contactless", "moto")
KNOWN_LABEL_SOURCES = ("chargeback", "manual_review", "customer_report")

# ISO 4217 / ISO 3166 are checked for shape (3 / 2 upper-case letters); the currency list below is
# what the simulator emits, not a limit: real feeds carry currencies we have never seen.
CURRENCY_RE = re.compile(r"^[A-Z]{3}$")
COUNTRY_RE = re.compile(r"^[A-Z]{2}$")
MCC_RE = re.compile(r"^[0-9]{4}$")
# RFC 3339: date, 'T' or ' ', time, optional fraction, mandatory 'Z' or +hh:mm offset.
RFC3339_RE = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)


@dataclass(frozen=True)
class Rejection:
    """Why a record was rejected: a named reason, the field at fault, a human-readable detail."""

    reason: RejectReason
    field: str | None
    detail: str

    def __str__(self) -> str:
        where = f" ({self.field})" if self.field else ""
        return f"{self.reason.value}{where}: {self.detail}"


def parse_rfc3339(value: str) -> datetime:
    """Parse an RFC 3339 timestamp to an aware UTC datetime; ``ValueError`` if it is not one."""
    if not RFC3339_RE.match(value):
        raise ValueError(f"not an RFC 3339 timestamp with offset: {value!r}")
    text = value.replace("z", "Z").replace("t", "T").replace(" ", "T")
    # Python's fromisoformat takes at most microseconds; truncate nanosecond fractions.
    m = re.match(r"^(.*\.\d{6})\d+(.*)$", text)
    if m:
        text = m.group(1) + m.group(2)
    return datetime.fromisoformat(text).astimezone(UTC)


def format_rfc3339(ts: datetime) -> str:
    """UTC timestamp as RFC 3339 with millisecond precision and a ``Z`` suffix."""
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


def validate_event(raw: bytes | str, kind: Kind) -> tuple[dict[str, Any] | None, Rejection | None]:
    """Decode and validate one record of ``kind``.

    Returns ``(record, None)`` for a valid record (the decoded JSON object, unknown fields kept,
    timestamps left as strings) or ``(None, rejection)`` naming the first problem found.
    Never raises on bad input.
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw
    except UnicodeDecodeError as exc:
        return None, Rejection(RejectReason.MALFORMED_JSON, None, str(exc))
    obj, rejection = decode_object(text)
    if rejection is not None:
        return None, rejection
    rejection = validate_object(obj, kind)
    return (None, rejection) if rejection else (obj, None)


def decode_object(text: str) -> tuple[dict[str, Any] | None, Rejection | None]:
    """JSON text -> object, or the rejection that names why it is not one. Never raises."""
    try:
        obj = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and an integer longer than Python's 4300-digit limit
        return None, Rejection(RejectReason.MALFORMED_JSON, None, str(exc))
    except RecursionError:
        return None, Rejection(RejectReason.MALFORMED_JSON, None, "JSON nested too deeply to decode")
    if not isinstance(obj, dict):
        return None, Rejection(RejectReason.NOT_AN_OBJECT, None, f"got JSON {type(obj).__name__}")
    return obj, None


def validate_object(obj: dict[str, Any], kind: Kind) -> Rejection | None:
    """Validate an already-decoded event object; ``None`` when it satisfies the contract."""
    version = obj.get("schema_version")
    if "schema_version" not in obj or version is None:
        return Rejection(RejectReason.MISSING_FIELD, "schema_version", "required field is absent")
    if type(version) is not int:
        return Rejection(RejectReason.WRONG_TYPE, "schema_version", f"expected int, got {type(version).__name__}")
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        return Rejection(
            RejectReason.UNKNOWN_SCHEMA_VERSION,
            "schema_version",
            f"version {version} not in supported {sorted(SUPPORTED_SCHEMA_VERSIONS)}",
        )
    for spec in FIELDS_BY_KIND[kind]:
        value = obj.get(spec.name)
        if value is None:
            if spec.required:
                return Rejection(RejectReason.MISSING_FIELD, spec.name, "required field is absent")
            continue
        rejection = _check_type(spec, value) or _check_value(spec, value)
        if rejection:
            return rejection
    return None


def _check_type(spec: FieldSpec, value: Any) -> Rejection | None:
    ok = {
        "int": type(value) is int,
        "string": isinstance(value, str),
        "timestamp": isinstance(value, str),
        "bool": isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
    }[spec.json_type]
    if not ok:
        return Rejection(RejectReason.WRONG_TYPE, spec.name, f"expected {spec.json_type}, got {type(value).__name__}")
    if isinstance(value, str) and not _is_unicode(value):
        # json.loads turns the escape "\ud800" into a lone surrogate: no UTF-8 encoding exists, so the
        # field could be neither stored nor compared. The record is as broken as one with non-UTF-8 bytes.
        return Rejection(RejectReason.MALFORMED_JSON, spec.name, "a \\u escape decodes to a lone surrogate, not text")
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_value(spec: FieldSpec, value: Any) -> Rejection | None:
    if spec.json_type == "timestamp":
        try:
            parse_rfc3339(value)
        except (ValueError, OverflowError) as exc:  # OverflowError: the UTC year leaves 1..9999
            return Rejection(RejectReason.BAD_TIME, spec.name, str(exc))
        return None
    if spec.check == "id" and not value.strip():
        return Rejection(RejectReason.EMPTY_ID, spec.name, "identifier is empty")
    if spec.check == "amount":
        if not _is_finite(value):
            return Rejection(RejectReason.NON_FINITE_AMOUNT, spec.name, f"amount is {value}")
        if value < 0:  # -0.0 is not below 0: accepted, like 0
            return Rejection(RejectReason.NEGATIVE_AMOUNT, spec.name, f"amount {value} is below 0")
    if spec.check == "currency" and not CURRENCY_RE.match(value):
        return Rejection(RejectReason.BAD_CURRENCY, spec.name, f"{value!r} is not an ISO 4217 code")
    if spec.check == "mcc" and not MCC_RE.match(value):
        return Rejection(RejectReason.BAD_MCC, spec.name, f"{value!r} is not 4 digits")
    if spec.check == "country" and not COUNTRY_RE.match(value):
        return Rejection(RejectReason.BAD_COUNTRY, spec.name, f"{value!r} is not ISO 3166 alpha-2")
    return None


def _is_finite(value: int | float) -> bool:
    # JSON integers are unbounded: a 400-digit amount does not fit a float and is no real amount.
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def event_key(obj: dict[str, Any], kind: Kind) -> bytes:
    """Kafka message key of a valid event, per contract (card_id / transaction_id)."""
    return str(obj[KEY_FIELD_BY_KIND[kind]]).encode("utf-8")


def detect_kind(obj: dict[str, Any]) -> Kind | None:
    """Which event kind a decoded object looks like (for files mixing both kinds)."""
    if "is_fraud" in obj or "reported_at" in obj:
        return Kind.LABEL
    if "event_time" in obj or "amount" in obj or "card_id" in obj:
        return Kind.TRANSACTION
    return None
