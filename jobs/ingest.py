"""Spark ingest job, for ``spark-submit`` (and plain ``python``; ``fraudctl ingest`` is the same).

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master local[2] jobs/ingest.py --run-date 2026-01-28
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master spark://host:7077 jobs/ingest.py \
        --start 2026-01-01 --end 2026-01-20 --from-kafka

(``PYSPARK_PYTHON``: the interpreter with this project installed; spark-submit would otherwise
start the driver with whatever ``python3`` is on the PATH.)

Nightly (``--run-date D``): new Kafka records -> raw store, then the dataset whose label cutoff is
D. Backfill (``--start/--end``): the dataset for that range from the raw store (first catching up
from Kafka with ``--from-kafka``). Under spark-submit, its ``--master`` is used unless this
script's own ``--master`` is given. Exit codes: 0 success, 1 failure (one line on stderr that says
what to do: Kafka unreachable, dates that cannot make the configured dataset, a dataset too small
to publish, ...), 2 bad arguments.

The terminal shows the job's own lines; Spark's, py4j's and librdkafka's go to the run log,
``<state>/logs/ingest/<run_id>.log`` (``[logs]`` in ingest.toml), named on the first line and in
the failure message. Under spark-submit, Spark's start-up lines precede the job's log4j setup; add
``--driver-java-options -Dlog4j2.configurationFile=...`` to send those elsewhere too.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

from pipeline.atomic import write_text_atomic
from pipeline.ingest.job import failure_message, load_job_configs, run_backfill, run_nightly
from pipeline.ingest.progress import print_summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="jobs/ingest.py", description=__doc__.split("\n\n")[0])
    when = parser.add_mutually_exclusive_group(required=True)
    when.add_argument("--run-date", type=date.fromisoformat, help="nightly run for this date (YYYY-MM-DD)")
    when.add_argument("--start", type=date.fromisoformat, help="backfill: first date (needs --end)")
    parser.add_argument("--end", type=date.fromisoformat, help="backfill: last date")
    parser.add_argument("--from-kafka", action="store_true", help="backfill: catch up from Kafka first")
    parser.add_argument("--env", default=None, help="config environment (conf/<env>/); default $FRAUD_ENV or dev")
    parser.add_argument("--master", default=None, help="Spark master (wins over spark-submit, $SPARK_MASTER, config)")
    parser.add_argument("--bootstrap-servers", default=None, help="Kafka bootstrap servers (wins over config)")
    parser.add_argument("--allow-data-loss", action="store_true",
                        help="continue past offsets deleted by retention (the loss is recorded)")
    parser.add_argument("--report-json", type=Path, default=None, help="also write the run report as JSON here")
    args = parser.parse_args(argv)
    if args.start and not args.end:
        parser.error("--start needs --end")
    if args.run_date and (args.end or args.from_kafka):
        parser.error("--end/--from-kafka belong to a backfill (--start/--end)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config, kafka = load_job_configs(args.env, args.bootstrap_servers)
        if args.run_date:
            report = run_nightly(config, kafka, args.run_date, allow_data_loss=args.allow_data_loss,
                                 master=args.master)
        else:
            report = run_backfill(config, kafka, args.start, args.end, from_kafka=args.from_kafka,
                                  allow_data_loss=args.allow_data_loss, master=args.master)
    except Exception as exc:  # noqa: BLE001 - expected failures become one line and exit 1
        message = failure_message(exc)
        if message is None:
            raise
        print(f"ingest failed: {message}", file=sys.stderr)
        return 1
    print_summary(report)
    if args.report_json:
        # The nightly DAG reads it as the night's ledger entry: never half-written.
        write_text_atomic(args.report_json, json.dumps(report.to_dict(), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
