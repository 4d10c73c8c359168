"""Spark-side validation of Kafka records, derived from the event contract.

:func:`pipeline.contract.validate_event` is the one definition of a valid event. Running it per
row in Python would make every record cross into a Python worker, so this module compiles the
same rules into vectorised Spark expressions, generated from ``FIELDS_BY_KIND``, the contract's
regexes and ``SUPPORTED_SCHEMA_VERSIONS``, in the contract's order, producing the same first
``RejectReason`` (parity is tested on a corpus covering every reason).

Where Spark's JSON parser and Python's ``json`` disagree, Spark does not guess: rows that
``try_parse_json`` refuses (NaN/Infinity literals, duplicate keys, control characters, ...),
that carry text after the object, that are not objects, or whose integers/timestamps fall in
the ranges where Spark and Python differ are routed to ``validate_event`` itself (an Arrow UDF
that only sees those rows). Its verdict and a clean re-encoding of the contract fields replace the
Spark ones. Known remaining difference: an object followed by extra text that itself ends in ``}``
without starting a new object (``{"a":1} "x"}``) is accepted by Spark's parser.
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.contract import (
    COUNTRY_RE,
    CURRENCY_RE,
    FIELDS_BY_KIND,
    MCC_RE,
    RFC3339_RE,
    SUPPORTED_SCHEMA_VERSIONS,
    FieldSpec,
    Kind,
    RejectReason,
    validate_event,
)

REASON = "reject_reason"  # RejectReason value, null when the record is valid
FIELD = "reject_field"  # contract field at fault, when there is one
PAYLOAD = "payload"  # the record's JSON text (unknown fields kept)
_PARSED = "_parsed"
ROUTED = "routed_to_python"  # diagnostic: decided by validate_event, not by Spark expressions

INTEGRAL_TYPES = ("TINYINT", "SMALLINT", "INT", "BIGINT")
SPARK_TYPE_BY_JSON_TYPE = {"int": "int", "string": "string", "number": "double", "bool": "boolean",
                           "timestamp": "timestamp"}
VALUE_CHECKS = {"id", "amount", "currency", "mcc", "country", None}
_JSON_WS = "[ \\t\\n\\r]*"  # what json.loads accepts around a document


def java_regex(python_pattern: str) -> str:
    """A contract regex for Spark's ``rlike`` (Java ``find``) with Python's meaning.

    ``(?d)``: only ``\\n`` ends a line, as for Python's ``$``; ``(?U)``: ``\\d`` matches Unicode
    digits, as it does for Python ``str`` patterns.
    """
    return "(?dU)" + python_pattern


def _python_whitespace_regex() -> str:
    """``\\A[ws]*\\z`` where ws is every character for which ``str.isspace()`` is true (``str.strip``)."""
    chars = "".join(f"\\x{{{ord(c):x}}}" for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())
    return f"\\A[{chars}]*\\z"


EMPTY_ID_REGEX = _python_whitespace_regex()
_REGEX_BY_CHECK = {"currency": (CURRENCY_RE, RejectReason.BAD_CURRENCY),
                   "mcc": (MCC_RE, RejectReason.BAD_MCC),
                   "country": (COUNTRY_RE, RejectReason.BAD_COUNTRY)}


def _check_contract_supported() -> None:
    # A new kind of rule in the contract must be compiled here too, not silently skipped.
    for specs in FIELDS_BY_KIND.values():
        for spec in specs:
            if spec.json_type not in SPARK_TYPE_BY_JSON_TYPE or spec.check not in VALUE_CHECKS:
                raise NotImplementedError(f"validate.py cannot compile contract field {spec}")
            if not spec.name.isidentifier():
                raise NotImplementedError(f"field name {spec.name!r} needs JSON-path quoting")


_check_contract_supported()


def _verdict(reason: RejectReason, field: str | None) -> Column:
    return F.struct(F.lit(reason.value).alias("reason"), F.lit(field).cast("string").alias("field"))


def _raw(parsed: Column, name: str) -> Column:
    return F.variant_get(parsed, f"$.{name}", "variant")


def _json_type(parsed: Column, name: str) -> Column:
    """Spark's name for the JSON type of a field: STRING, BIGINT, DECIMAL(p,s), DOUBLE, BOOLEAN,
    VOID (JSON null), OBJECT<..>, ARRAY<..>; null when the key is absent."""
    return F.schema_of_variant(_raw(parsed, name))


def _typed(parsed: Column, spec: FieldSpec) -> Column:
    if spec.json_type == "timestamp":
        return F.upper(F.try_variant_get(parsed, f"$.{spec.name}", "string")).try_cast("timestamp")
    return F.try_variant_get(parsed, f"$.{spec.name}", SPARK_TYPE_BY_JSON_TYPE[spec.json_type])


def _type_ok(spec: FieldSpec, t: Column) -> Column:
    if spec.json_type == "int":
        return t.isin(*INTEGRAL_TYPES)
    if spec.json_type in ("string", "timestamp"):
        return t == "STRING"
    if spec.json_type == "bool":
        return t == "BOOLEAN"
    return t.isin(*INTEGRAL_TYPES, "DOUBLE", "FLOAT") | t.startswith("DECIMAL")  # number


def _value_problems(parsed: Column, spec: FieldSpec) -> list[tuple[Column, RejectReason]]:
    """(condition, reason) pairs in the order ``contract._check_value`` tests them."""
    path = f"$.{spec.name}"
    if spec.json_type == "timestamp":
        text = F.try_variant_get(parsed, path, "string")
        return [(~text.rlike(java_regex(RFC3339_RE.pattern)), RejectReason.BAD_TIME)]
    if spec.check == "id":
        return [(F.try_variant_get(parsed, path, "string").rlike(EMPTY_ID_REGEX), RejectReason.EMPTY_ID)]
    if spec.check == "amount":
        x = F.try_variant_get(parsed, path, "double")
        return [(F.isnan(x) | (F.abs(x) == float("inf")), RejectReason.NON_FINITE_AMOUNT),
                (x <= 0, RejectReason.NON_POSITIVE_AMOUNT)]
    if spec.check in _REGEX_BY_CHECK:
        regex, reason = _REGEX_BY_CHECK[spec.check]
        return [(~F.try_variant_get(parsed, path, "string").rlike(java_regex(regex.pattern)), reason)]
    return []


def _field_verdicts(parsed: Column, spec: FieldSpec) -> list[Column]:
    t = _json_type(parsed, spec.name)
    absent = t.isNull() | (t == "VOID")
    checks = []
    if spec.required:
        checks.append(F.when(absent, _verdict(RejectReason.MISSING_FIELD, spec.name)))
    checks.append(F.when(~absent & ~_type_ok(spec, t), _verdict(RejectReason.WRONG_TYPE, spec.name)))
    for bad, reason in _value_problems(parsed, spec):
        checks.append(F.when(~absent & _type_ok(spec, t) & bad, _verdict(reason, spec.name)))
    return checks


def spark_verdict(parsed: Column, kind: Kind) -> Column:
    """First contract problem of a parsed JSON object as ``struct(reason, field)``; null when valid.

    Mirrors ``contract.validate_object``: schema_version first (missing, type, supported), then
    every field in ``FIELDS_BY_KIND`` order: missing (if required), type, value.
    """
    version_type = _json_type(parsed, "schema_version")
    version = F.try_variant_get(parsed, "$.schema_version", "bigint")
    checks = [
        F.when(version_type.isNull() | (version_type == "VOID"),
               _verdict(RejectReason.MISSING_FIELD, "schema_version")),
        F.when(~version_type.isin(*INTEGRAL_TYPES), _verdict(RejectReason.WRONG_TYPE, "schema_version")),
        F.when(~version.isin(*sorted(SUPPORTED_SCHEMA_VERSIONS)),
               _verdict(RejectReason.UNKNOWN_SCHEMA_VERSION, "schema_version")),
    ]
    for spec in FIELDS_BY_KIND[kind]:
        checks.extend(_field_verdicts(parsed, spec))
    return F.coalesce(*checks)


def _spark_unsure(text: Column, parsed: Column, kind: Kind) -> Column:
    """Rows where Spark's reading may differ from Python's: decided by ``validate_event`` instead."""
    unsure = (parsed.isNull()
              | ~F.schema_of_variant(parsed).startswith("OBJECT")
              | ~F.rtrim(text, F.lit(" \t\n\r")).endswith("}")
              | text.rlike(f"\\}}{_JSON_WS}\\{{"))
    for spec in FIELDS_BY_KIND[kind]:
        t = _json_type(parsed, spec.name)
        if spec.json_type == "int":
            # An integer beyond 64 bits and a float such as 1.0 both read as DECIMAL(p,0).
            unsure = unsure | t.rlike("^DECIMAL\\(\\d+,0\\)$")
        if spec.json_type == "timestamp":
            raw = F.try_variant_get(parsed, f"$.{spec.name}", "string")
            ts = _typed(parsed, spec)
            # Python rejects year 0 and offsets Spark refuses (+19:00, +02:60) are fine in Python.
            odd = ts.isNull() | (F.year(ts) < 1) | (F.year(ts) > 9999) | raw.startswith("0000")
            unsure = unsure | ((t == "STRING") & raw.rlike(java_regex(RFC3339_RE.pattern)) & odd)
    return F.coalesce(unsure, F.lit(True))


def _python_decisions(kind: Kind):
    """Arrow UDF: ``validate_event`` on the routed rows (others arrive as null and stay null)."""
    names = [s.name for s in FIELDS_BY_KIND[kind]]

    @F.arrow_udf("struct<reason string, field string, clean string>")
    def decide(values: pa.Array) -> pa.Array:
        reasons, fields, clean = [], [], []
        for raw in values.to_pylist():
            reason = field = text = None
            if raw is not None:
                try:
                    record, rejection = validate_event(raw, kind)
                except (OverflowError, RecursionError) as exc:  # validate_event should catch these itself
                    record, reason, field = None, RejectReason.BAD_TIME.value, str(exc)
                    rejection = None
                if rejection is not None:
                    reason, field = rejection.reason.value, rejection.field
                elif record is not None:
                    subset = {k: record[k] for k in names if record.get(k) is not None}
                    text = json.dumps(subset, ensure_ascii=False).encode("utf-8", "replace").decode("utf-8")
            reasons.append(reason)
            fields.append(field)
            clean.append(text)
        return pa.StructArray.from_arrays([pa.array(reasons, pa.string()), pa.array(fields, pa.string()),
                                           pa.array(clean, pa.string())], names=["reason", "field", "clean"])

    return decide


def classify_records(records: DataFrame, kind: Kind, diagnostics: bool = False) -> DataFrame:
    """Kafka records -> records + ``reject_reason``, ``reject_field``, ``payload`` and the typed
    contract fields (null where the record is invalid); ``diagnostics`` keeps ``routed_to_python``.

    Input columns: ``topic, partition, offset, timestamp, key, value`` (value = UTF-8 JSON bytes).
    Pure: no action is run.
    """
    text = F.col("value").cast("string")
    df = records.withColumn(PAYLOAD, text).withColumn(_PARSED, F.try_parse_json(text))
    utf8 = F.coalesce(F.is_valid_utf8(F.col(PAYLOAD)), F.lit(True))
    df = df.withColumn(ROUTED, utf8 & _spark_unsure(F.col(PAYLOAD), F.col(_PARSED), kind))
    routed_value = F.when(F.col(ROUTED), F.coalesce(F.col("value"), F.lit(b"")))
    df = df.withColumn("_py", _python_decisions(kind)(routed_value))
    verdict = (F.when(~utf8, _verdict(RejectReason.MALFORMED_JSON, None))
               .when(F.col(ROUTED), F.struct(F.col("_py.reason").alias("reason"), F.col("_py.field").alias("field")))
               .otherwise(spark_verdict(F.col(_PARSED), kind)))
    parsed = F.when(F.col(ROUTED), F.try_parse_json(F.col("_py.clean"))).otherwise(F.col(_PARSED))
    df = df.withColumn("_verdict", verdict).withColumn(_PARSED, parsed)
    valid = F.col("_verdict").isNull() | F.col("_verdict.reason").isNull()
    typed = [F.when(valid, _typed(F.col(_PARSED), s)).alias(s.name) for s in FIELDS_BY_KIND[kind]]
    extra = [ROUTED] if diagnostics else []
    return df.select(*records.columns, F.col("_verdict.reason").alias(REASON), F.col("_verdict.field").alias(FIELD),
                     PAYLOAD, *typed, *extra)
