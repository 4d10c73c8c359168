"""Event files: write simulated transactions and labels as JSONL or Parquet, and read any such file
back line by line with per-line contract validation (what ``fraudctl produce`` replays).

JSONL holds one compact UTF-8 JSON object per line. Parquet holds the contract columns; absent
optional fields are nulls, which reading turns back into absent keys. Writes are atomic
(:func:`pipeline.atomic.atomic_path`: temp file, fsync, rename), so a killed run never leaves a half-written file under the final name.

Reading never fails on a line's content: every line of a readable file ends as a valid event or as
a rejected line with a named reason (bytes that are not UTF-8, JSON nested past the recursion limit,
an integer past Python's digit limit, a scalar or array, NaN or a lone surrogate that cannot be sent).
Only a file that cannot be read at all raises :class:`EventFileError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.atomic import atomic_path
from pipeline.contract import Kind, Rejection, RejectReason, decode_object, detect_kind, validate_object
from pipeline.kafka.producer import dumps_event
from pipeline.simulation.simulator import Simulation

EventFormat = Literal["jsonl", "parquet"]
EVENT_FORMATS: tuple[EventFormat, ...] = ("jsonl", "parquet")
_PARQUET_BATCH_ROWS = 65_536


class EventFileError(ValueError):
    """An event file cannot be read at all (missing, unknown format, corrupt Parquet)."""


def write_jsonl(records: Iterable[dict[str, Any]], path: Path) -> int:
    """Write ``records`` one per line; returns how many."""
    count = 0
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(dumps_event(record))
            fh.write("\n")
            count += 1
    return count


def write_parquet(frame: pd.DataFrame, path: Path) -> int:
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)
    return len(frame)


def write_simulation(sim: Simulation, out_dir: Path, fmt: EventFormat = "jsonl") -> dict[str, Path]:
    """Write ``transactions.<fmt>`` and ``labels.<fmt>`` into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"transactions": out_dir / f"transactions.{fmt}", "labels": out_dir / f"labels.{fmt}"}
    if fmt == "jsonl":
        write_jsonl(sim.transaction_records(), paths["transactions"])
        write_jsonl(sim.label_records(), paths["labels"])
    elif fmt == "parquet":
        write_parquet(sim.transactions, paths["transactions"])
        write_parquet(sim.labels, paths["labels"])
    else:
        raise EventFileError(f"unknown event file format {fmt!r}; choose one of {EVENT_FORMATS}")
    return paths


@dataclass(frozen=True)
class EventLine:
    """One record of an event file as text: JSONL line number, or 1-based Parquet row number."""

    line_no: int
    text: str
    decode_error: str | None = None  # set when the bytes were not UTF-8 (text then has replacements)


@dataclass(frozen=True)
class ValidEvent:
    line_no: int
    kind: Kind
    record: dict[str, Any]


@dataclass(frozen=True)
class RejectedLine:
    line_no: int
    rejection: Rejection
    raw: str

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line_no, "reason": self.rejection.reason.value, "field": self.rejection.field,
                "detail": self.rejection.detail, "raw": self.raw}


@dataclass
class EventScan:
    """Every line of a file, sorted into valid events and rejected lines (in file order)."""

    valid: list[ValidEvent] = field(default_factory=list)
    rejected: list[RejectedLine] = field(default_factory=list)

    def reject_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for line in self.rejected:
            counts[line.rejection.reason.value] = counts.get(line.rejection.reason.value, 0) + 1
        return dict(sorted(counts.items()))


def detect_format(path: Path) -> EventFormat:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise EventFileError(f"{path}: cannot tell the format from the extension {suffix!r}; "
                         f"use .jsonl (one JSON object per line) or .parquet")


def read_event_lines(path: Path) -> Iterator[EventLine]:
    """Every record of a JSONL or Parquet file as text; blank JSONL lines are skipped."""
    if not path.is_file():
        raise EventFileError(f"{path}: no such file")
    if detect_format(path) == "jsonl":
        yield from _jsonl_lines(path)
    else:
        yield from _parquet_lines(path)


def scan_events(lines: Iterable[EventLine]) -> EventScan:
    """Validate each line against the contract; the kind of each record is detected from its fields."""
    scan = EventScan()
    for line in lines:
        if line.decode_error:
            scan.rejected.append(RejectedLine(line.line_no, Rejection(RejectReason.MALFORMED_JSON, None,
                                                                      line.decode_error), line.text))
            continue
        record, rejection = parse_event(line.text)
        if rejection is not None:
            scan.rejected.append(RejectedLine(line.line_no, rejection, line.text))
        else:
            scan.valid.append(ValidEvent(line.line_no, record[0], record[1]))
    return scan


def parse_event(text: str) -> tuple[tuple[Kind, dict[str, Any]] | None, Rejection | None]:
    """``((kind, record), None)`` for a valid event of either kind that can be sent as it is, else
    ``(None, rejection)``. Never raises on the text's content."""
    obj, rejection = decode_object(text)
    if rejection is not None:
        return None, rejection
    kind = detect_kind(obj)
    if kind is None:
        return None, Rejection(RejectReason.MISSING_FIELD, None,
                               "neither a transaction (event_time, amount, card_id) nor a label "
                               "(is_fraud, reported_at)")
    rejection = validate_object(obj, kind) or _unsendable(obj)
    return (None, rejection) if rejection else ((kind, obj), None)


def _unsendable(obj: dict[str, Any]) -> Rejection | None:
    """Why the record's wire form (:func:`dumps_event`, UTF-8) cannot be built, if it cannot.

    The contract checks its own fields; an extra field may still hold NaN/Infinity (``json.loads``
    accepts them, JSON does not) or a lone surrogate from a ``\\ud800`` escape (no UTF-8 exists).
    Rejected here, the line is named in the reject file instead of failing at delivery.
    """
    try:
        dumps_event(obj).encode("utf-8")
    except (ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        return Rejection(RejectReason.MALFORMED_JSON, None, f"cannot be sent as UTF-8 JSON: {exc}")
    return None


def write_rejects(rejected: Iterable[RejectedLine], path: Path) -> int:
    """One JSON object per rejected line: line number, reason, field, detail and the raw text."""
    return write_jsonl((line.to_json() for line in rejected), path)


def _jsonl_lines(path: Path) -> Iterator[EventLine]:
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            try:
                text, error = raw.decode("utf-8"), None
            except UnicodeDecodeError as exc:
                text, error = raw.decode("utf-8", errors="replace"), f"not UTF-8: {exc}"
            text = text.rstrip("\r\n")
            if text.strip():
                yield EventLine(line_no, text, error)


def _parquet_lines(path: Path) -> Iterator[EventLine]:
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise EventFileError(f"{path}: not a readable Parquet file ({exc})") from exc
    row = 0
    try:
        for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
            for values in batch.to_pylist():
                row += 1
                obj = {k: v for k, v in values.items() if v is not None}
                yield EventLine(row, json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str))
    except (pa.ArrowException, OSError) as exc:  # a corrupt page surfaces only when its row group is read
        raise EventFileError(f"{path}: unreadable Parquet data after row {row} ({exc})") from exc
