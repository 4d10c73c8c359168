"""Validation of Kafka record values against the event contract, vectorised with Arrow.

:func:`pipeline.contract.validate_event` is the one definition of a valid event and of every
``RejectReason``. This module makes it fast without redefining it ("accept fast, reject exact"):

1. Fast path, per Arrow batch: records that are one-line JSON objects are parsed together by
   Arrow's JSON reader against a strict schema generated from ``FIELDS_BY_KIND`` (a field of the
   wrong JSON type, a duplicate key, a NaN in an int field... fails the block, which is then
   bisected). Parsed rows are then checked with vectorised, deliberately *stricter* versions of the
   contract's rules (the contract's own currency/MCC/country regexes, a canonical
   ``YYYY-MM-DDTHH:MM:SS[.f]Z`` time that must round-trip, ASCII-visible ids, finite amounts
   ``>= 0``). A block that is not entirely valid UTF-8 fails too: Arrow's reader does not check
   the bytes of fields it ignores. The fast path only ever *accepts*.
2. Exact path: every record the fast path did not accept goes through ``validate_event`` itself,
   which decides valid or rejected and names the reason, field and detail.

So every rejection reason is the contract's by construction, and the fast path's soundness
("never accepts what the contract rejects") is what the tests check, on a corpus covering every
reason and on randomly mutated records. Typical clean traffic never touches the per-record
Python path. The ingest job runs this inside the Kafka read tasks (:mod:`pipeline.ingest.landing`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from pipeline.contract import (
    COUNTRY_RE,
    CURRENCY_RE,
    FIELDS_BY_KIND,
    MCC_RE,
    SUPPORTED_SCHEMA_VERSIONS,
    FieldSpec,
    Kind,
    parse_rfc3339,
    validate_event,
)

REASON = "reject_reason"  # RejectReason value, null when the record is valid
FIELD = "reject_field"  # contract field at fault, when there is one
DETAIL = "reject_detail"  # the Rejection's human-readable detail (the quarantine keeps it)
ROUTED = "decided_by_contract"  # diagnostic: the per-record validate_event path decided this row

PARSE_TYPES = {"int": pa.int64(), "string": pa.string(), "timestamp": pa.string(), "number": pa.float64(),
               "bool": pa.bool_()}
OUTPUT_TYPES = {"int": pa.int32(), "string": pa.string(), "timestamp": pa.timestamp("us", tz="UTC"),
                "number": pa.float64(), "bool": pa.bool_()}
SPARK_TYPES = {"int": "int", "string": "string", "timestamp": "timestamp", "number": "double", "bool": "boolean"}
VALUE_CHECKS = {"id", "amount", "currency", "mcc", "country", None}
# A strict subset of contract.RFC3339_RE: UTC "Z" form with ASCII digits (what producers emit).
CANONICAL_TIME = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z$"
_EPOCH = "1970-01-01T00:00:00Z"
_REGEX_BY_CHECK = {"currency": CURRENCY_RE, "mcc": MCC_RE, "country": COUNTRY_RE}
MIN_BISECT_BLOCK = 16  # below this, a failing block goes record by record to validate_event


def _check_contract_supported() -> None:
    # A new kind of rule in the contract must be compiled here too, not silently skipped.
    for specs in FIELDS_BY_KIND.values():
        for spec in specs:
            if spec.json_type not in PARSE_TYPES or spec.check not in VALUE_CHECKS:
                raise NotImplementedError(f"validate.py has no fast check for contract field {spec}")


_check_contract_supported()


def output_schema(kind: Kind) -> pa.Schema:
    """Arrow schema of :func:`validate_values`' result."""
    return pa.schema([(REASON, pa.string()), (FIELD, pa.string()), (DETAIL, pa.string()), (ROUTED, pa.bool_())]
                     + [(s.name, OUTPUT_TYPES[s.json_type]) for s in FIELDS_BY_KIND[kind]])


def one_line_objects(values: pa.Array) -> pa.Array:
    """Values shaped ``{...}`` with no line break: the only shape the fast path reads (Arrow reads
    newline-delimited JSON; a BOM, leading blanks or a pretty-printed object go the exact path).

    Line breaks are first looked for in the array's whole data buffer at once (memchr speed): in
    clean traffic there are none, and the per-value search, two scans of every value, cost more
    than parsing them. Only when the buffer holds one (perhaps outside this slice) are values
    searched one by one."""
    shaped = pc.and_(pc.starts_with(values, "{"), pc.ends_with(values, "}"))
    if _may_hold_line_breaks(values):
        broken = pc.or_(pc.match_substring(values, "\n"), pc.match_substring(values, "\r"))
        shaped = pc.and_(shaped, pc.invert(broken))
    return pc.fill_null(shaped, False)


def _may_hold_line_breaks(values: pa.Array) -> bool:
    """False only if no value of the binary array ``values`` contains a CR or LF byte."""
    data = values.buffers()[2]  # every value's bytes (and, for a slice, its neighbours')
    if data is None:
        return False
    raw = data.to_pybytes()
    return b"\n" in raw or b"\r" in raw


def _parse_options(kind: Kind) -> pj.ParseOptions:
    schema = pa.schema([(s.name, PARSE_TYPES[s.json_type]) for s in FIELDS_BY_KIND[kind]])
    return pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")


def _read_lines(values: pa.Array, kind: Kind) -> pa.Table | None:
    """Parse ``values`` (one-line objects) as newline-delimited JSON; None unless one row each."""
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values), b"\n")
    try:
        values.cast(pa.string())  # raises on bytes that are not UTF-8 (see the module doc)
        table = pj.read_json(pa.BufferReader(joined[0].as_buffer()), read_options=pj.ReadOptions(use_threads=False),
                             parse_options=_parse_options(kind))
    except (pa.ArrowException, ValueError):
        return None
    return table.combine_chunks() if table.num_rows == len(values) else None  # "{..}{..}" gives 2 rows


def _parse_blocks(values: pa.Array, positions: pa.Array, kind: Kind) -> list[tuple[pa.Array, pa.Table]]:
    """Parsed ``(positions, rows)`` blocks; positions missing from the result did not parse."""
    if len(positions) == 0:
        return []
    table = _read_lines(values if len(positions) == len(values) else values.take(positions), kind)
    if table is not None:
        return [(positions, table)]
    if len(positions) <= MIN_BISECT_BLOCK:
        return []
    mid = len(positions) // 2
    return _parse_blocks(values, positions[:mid], kind) + _parse_blocks(values, positions[mid:], kind)


def _canonical_times(text: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``(ok, timestamps)``: canonical UTC form whose date and time exist (Arrow's cast checks
    that, as ``datetime.fromisoformat`` does); timestamps are null where not ok."""
    shaped = pc.fill_null(pc.and_(pc.match_substring_regex(text, CANONICAL_TIME),
                                  pc.not_equal(pc.utf8_slice_codeunits(text, 0, 4), "0000")), False)
    safe = pc.if_else(shaped, text, _EPOCH)
    try:
        parsed = pc.cast(safe, OUTPUT_TYPES["timestamp"])
    except pa.ArrowInvalid:  # some shaped value is not a real instant (Feb 30, 24:00): find it row by row
        head = pc.utf8_slice_codeunits(safe, 0, 19)
        seconds = pc.strptime(head, format="%Y-%m-%dT%H:%M:%S", unit="s", error_is_null=True)
        shaped = pc.and_(shaped, pc.fill_null(pc.equal(pc.strftime(seconds, format="%Y-%m-%dT%H:%M:%S"), head),
                                              False))
        parsed = pc.cast(pc.if_else(shaped, text, _EPOCH), OUTPUT_TYPES["timestamp"])
    return shaped, pc.if_else(shaped, parsed, pa.scalar(None, OUTPUT_TYPES["timestamp"]))


def _value_ok(spec: FieldSpec, col: pa.Array) -> pa.Array:
    """Stricter-than-contract value rule of a non-timestamp field (nulls are the caller's business)."""
    if spec.check == "id":
        return pc.match_substring_regex(col, "[!-~]")  # a visible ASCII character: surely not blank
    if spec.check == "amount":
        return pc.and_kleene(pc.is_finite(col), pc.greater_equal(col, 0))  # -0.0 >= 0, as in Python
    if spec.check in _REGEX_BY_CHECK:
        # RE2 (ASCII classes, '$' only at the very end) is stricter than Python's re here.
        return pc.match_substring_regex(col, _REGEX_BY_CHECK[spec.check].pattern)
    return pa.repeat(True, len(col))


def fast_path(table: pa.Table, kind: Kind) -> tuple[pa.Array, dict[str, pa.Array]]:
    """For a strictly parsed table: which rows surely satisfy the contract (False = not sure), and
    their typed contract columns."""
    ok = pc.is_in(table["schema_version"].combine_chunks(), pa.array(sorted(SUPPORTED_SCHEMA_VERSIONS), pa.int64()))
    typed = {}
    for spec in FIELDS_BY_KIND[kind]:
        col = table[spec.name].combine_chunks()
        if spec.json_type == "timestamp":
            rule, typed[spec.name] = _canonical_times(col)
        else:
            rule, typed[spec.name] = _value_ok(spec, col), pc.cast(col, OUTPUT_TYPES[spec.json_type])
        present = pc.is_valid(col)
        rule = pc.fill_null(rule, False)
        ok = pc.and_(ok, pc.and_(present, rule) if spec.required else pc.or_(pc.invert(present), rule))
    return pc.fill_null(ok, False), typed


def _exact_rows(values: Sequence[bytes | None], kind: Kind) -> pa.Table:
    """``validate_event`` on each value: the contract's verdict and, when valid, its typed fields."""
    schema = output_schema(kind)
    cols: dict[str, list] = {name: [] for name in schema.names}
    for raw in values:
        record, rejection = validate_event(raw if raw is not None else b"", kind)
        cols[REASON].append(rejection.reason.value if rejection else None)
        cols[FIELD].append(rejection.field if rejection else None)
        cols[DETAIL].append(rejection.detail if rejection else None)
        cols[ROUTED].append(True)
        for spec in FIELDS_BY_KIND[kind]:
            value = record.get(spec.name) if record is not None else None
            if value is not None and spec.json_type == "timestamp":
                value = parse_rfc3339(value)
            elif value is not None and spec.json_type == "number":
                value = float(value)
            cols[spec.name].append(value)
    return pa.table(cols, schema=schema)


def validate_values(values: pa.Array, kind: Kind) -> pa.Table:
    """Verdict per value (same order): ``reject_reason``, ``reject_field``, ``reject_detail``,
    ``decided_by_contract`` and the typed contract fields (null unless valid)."""
    values = values.cast(pa.binary())
    n = len(values)
    candidates = pc.indices_nonzero(one_line_objects(values))
    fast_pos, fast_tables = [], []
    for positions, table in _parse_blocks(values, candidates, kind):
        accept, typed = fast_path(table, kind)
        fast_pos.append(positions.filter(accept))
        fast_tables.append(pa.table(typed).filter(accept))
    accepted = pa.concat_arrays(fast_pos).cast(pa.uint64()) if fast_pos else pa.array([], pa.uint64())
    is_accepted = np.zeros(n, dtype=bool)
    is_accepted[accepted.to_numpy()] = True
    slow_pos = pa.array(np.flatnonzero(~is_accepted).astype(np.uint64))
    parts = [_exact_rows(values.take(slow_pos).to_pylist(), kind)]
    if len(accepted):
        typed = pa.concat_tables(fast_tables).combine_chunks()
        m = len(accepted)
        verdict = {REASON: pa.nulls(m, pa.string()), FIELD: pa.nulls(m, pa.string()),
                   DETAIL: pa.nulls(m, pa.string()), ROUTED: pa.repeat(False, m)}
        parts.append(pa.table({**verdict, **{name: typed[name] for name in typed.column_names}},
                              schema=output_schema(kind)))
    if not len(slow_pos):  # every value accepted (clean traffic); fast blocks come in position order
        return parts[-1]
    merged = pa.concat_tables(parts)
    order = pc.sort_indices(pa.concat_arrays([slow_pos, accepted]))
    return merged.take(order)
