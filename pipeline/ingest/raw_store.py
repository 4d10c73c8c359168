"""Spark's readers of the raw store (:mod:`pipeline.ingest.raw_layout` has the layout, the file
schemas and the commit-aware listing, without Spark).

Readers filter on the committed run ids of the commit log, so a run killed at any point leaves
nothing they see; a table with no committed files reads as an empty DataFrame of its schema.
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pipeline.contract import Kind
from pipeline.ingest.raw_layout import (
    DATE_COLUMN_BY_KIND,
    QUARANTINE,
    QUARANTINE_COLUMNS,
    RUN_ID,
    RawStore,
    file_columns,
)

_SPARK = {"string": StringType(), "int": IntegerType(), "long": LongType(), "double": DoubleType(),
          "boolean": BooleanType(), "timestamp": TimestampType(), "date": DateType(), "binary": BinaryType()}


def raw_schema(kind: Kind) -> StructType:
    """Spark schema of a raw table: file columns plus the ``<date>`` and ``run_id`` partition columns."""
    columns = file_columns(kind) + [(DATE_COLUMN_BY_KIND[kind], "date"), (RUN_ID, "string")]
    return StructType([StructField(n, _SPARK[t], True) for n, t in columns])


QUARANTINE_SCHEMA = StructType([StructField(n, _SPARK[t], True) for n, t in QUARANTINE_COLUMNS + [(RUN_ID, "string")]])


def read_raw_table(spark: SparkSession, store: RawStore, kind: Kind, start: date | None = None,
                   end: date | None = None) -> DataFrame:
    """Rows of a raw table from committed runs, optionally only partition dates in ``[start, end]``."""
    schema = raw_schema(kind)
    path = store.table_path(kind)
    runs = list(store.committed().runs)
    if not runs or not any(path.glob(f"*/{RUN_ID}=*/*.parquet")):
        return spark.createDataFrame([], schema)
    df = spark.read.schema(schema).parquet(str(path)).filter(F.col(RUN_ID).isin(runs))
    date_col = F.col(DATE_COLUMN_BY_KIND[kind])
    if start is not None:
        df = df.filter(date_col >= F.lit(start))
    if end is not None:
        df = df.filter(date_col <= F.lit(end))
    return df


def read_quarantine(spark: SparkSession, store: RawStore) -> DataFrame:
    """The quarantine table of committed runs (reason, field, raw key and value, Kafka position)."""
    runs = list(store.committed().runs)
    path = store.root / QUARANTINE
    if not runs or not any(path.glob(f"{RUN_ID}=*/*.parquet")):
        return spark.createDataFrame([], QUARANTINE_SCHEMA)
    return spark.read.schema(QUARANTINE_SCHEMA).parquet(str(path)).filter(F.col(RUN_ID).isin(runs))

