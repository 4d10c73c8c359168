"""fraud_backfill: rebuild the dataset of a date range with spark-submit, on demand.

Trigger with params ``start`` and ``end`` (YYYY-MM-DD; the range must span the configured
train + validation + test days, as ``jobs/ingest.py --start/--end`` requires) and optionally
``from_kafka`` (catch the raw store up from Kafka first). Idempotent like the job: the same range
over the same raw store republishes the same dataset version. Its XCom is that dataset's record.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from pipeline.nightly import dag_tasks
from pipeline.nightly.config import load_nightly_config

config = load_nightly_config()

with DAG(
    dag_id="fraud_backfill",
    description="Rebuild a date range's dataset from the raw store (spark-submit jobs/ingest.py --start/--end)",
    schedule=None,
    start_date=dag_tasks.start_date(config.schedule),
    catchup=False,
    max_active_runs=1,
    default_args=dag_tasks.default_args(config.schedule),
    params={
        "start": Param(None, type=["null", "string"], format="date", description="first date (YYYY-MM-DD)"),
        "end": Param(None, type=["null", "string"], format="date", description="last date (YYYY-MM-DD)"),
        "from_kafka": Param(False, type="boolean", description="catch the raw store up from Kafka first"),
    },
    doc_md=__doc__,
    tags=["fraud", "backfill"],
):
    dag_tasks.BackfillIngestOperator(task_id="backfill", spark=config.spark_submit)
