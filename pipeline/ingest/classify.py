"""Kafka records -> records with a verdict and typed contract fields (Arrow, batch by batch).

:func:`classify_batch` validates one Arrow batch (:mod:`pipeline.ingest.validate`) and screens it
for timing (:mod:`pipeline.ingest.timing`). The ingest job runs it inside the Kafka read tasks
(:mod:`pipeline.ingest.landing`); :func:`classify_records` runs it over any DataFrame of Kafka
records with ``mapInArrow`` (diagnostics, and the parity tests of the Spark path).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict

import pyarrow as pa
from pyspark.sql import DataFrame

from pipeline.contract import FIELDS_BY_KIND, Kind
from pipeline.ingest.kafka_source import RECORD_SCHEMA, BatchTransform
from pipeline.ingest.timing import ReadState, TimingRules, screen_timing
from pipeline.ingest.validate import DETAIL, FIELD, REASON, ROUTED, SPARK_TYPES, validate_values


def verdict_columns(kind: Kind, diagnostics: bool = False) -> list[tuple[str, str]]:
    """(name, Spark type) of the columns classification appends to the record columns."""
    columns = [(REASON, "string"), (FIELD, "string"), (DETAIL, "string")]
    columns += [(s.name, SPARK_TYPES[s.json_type]) for s in FIELDS_BY_KIND[kind]]
    return columns + ([(ROUTED, "boolean")] if diagnostics else [])


def classified_ddl(kind: Kind, diagnostics: bool = False) -> str:
    return ", ".join([RECORD_SCHEMA] + [f"{n} {t}" for n, t in verdict_columns(kind, diagnostics)])


def classify_batch(batch: pa.RecordBatch, kind: Kind, rules: TimingRules | None, state: ReadState | None,
                   diagnostics: bool = False) -> pa.Table:
    """One batch of records -> the same rows with verdict and typed columns (pure; tested directly)."""
    verdicts = validate_values(batch.column("value"), kind).select([n for n, _ in verdict_columns(kind, diagnostics)])
    table = pa.Table.from_batches([batch])
    for name in verdicts.column_names:
        table = table.append_column(name, verdicts[name])
    if rules is not None:
        table = screen_timing(table, kind, rules, state)
    return table


def classify_stream(batches: Iterator[pa.RecordBatch], args: dict) -> Iterator[pa.RecordBatch]:
    """The :class:`BatchTransform` entry point: ``args`` from :func:`classify_transform`."""
    kind = Kind(args["kind"])
    rules = TimingRules.from_dict(args["rules"]) if args["rules"] else None
    state = ReadState(dict(rules.committed_watermarks)) if rules is not None else None
    for batch in batches:
        yield from classify_batch(batch, kind, rules, state, args["diagnostics"]).to_batches()


def classify_transform(kind: Kind, rules: TimingRules | None, diagnostics: bool = False) -> BatchTransform:
    return BatchTransform("pipeline.ingest.classify:classify_stream",
                          {"kind": kind.value, "rules": asdict(rules) if rules else None, "diagnostics": diagnostics},
                          classified_ddl(kind, diagnostics))


def classify_records(records: DataFrame, kind: Kind, rules: TimingRules | None = None,
                     diagnostics: bool = False) -> DataFrame:
    """Classify an existing frame of Kafka records (``RECORD_COLUMNS``) with ``mapInArrow``; apply it
    directly to a Kafka read (the timing screen relies on the read order)."""
    transform = classify_transform(kind, rules, diagnostics)
    args = transform.args
    return records.select(*[c.split()[0] for c in RECORD_SCHEMA.split(", ")]).mapInArrow(
        lambda batches: classify_stream(batches, args), transform.schema)
