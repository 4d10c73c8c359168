"""Spark ingest job, for ``spark-submit`` (and plain ``python``; ``fraudctl ingest`` is the same).

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master local[2] jobs/ingest.py --run-date 2026-01-28
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master spark://host:7077 jobs/ingest.py \
        --start 2026-01-01 --end 2026-01-20 --from-kafka

(``PYSPARK_PYTHON``: the interpreter with this project installed; spark-submit would otherwise
start the driver with whatever ``python3`` is on the PATH. A relative path is made absolute here,
before Spark starts: executors, a ``local-cluster``'s included, start it in their own directories.)

Nightly (``--run-date D``): new Kafka records -> raw store, then the dataset whose label cutoff is
D. Backfill (``--start/--end``): the dataset for that range from the raw store (first catching up
from Kafka with ``--from-kafka``). Under spark-submit, its ``--master`` is used unless this
script's own ``--master`` is given. Exit codes: 0 success, 1 failure (one line on stderr that says
what to do: Kafka unreachable, dates that cannot make the configured dataset, a dataset too small
to publish, ...), 2 bad arguments.

The terminal shows the job's own lines; Spark's, py4j's and librdkafka's go to the run log,
``<state>/logs/ingest/<run_id>.log`` (``[logs]`` in ingest.toml), named on the first line and in
the failure message. Under spark-submit, the JVM is up before this script runs: the SparkContext
starts at ERROR (:func:`quiet_spark_submit_start_up`), the run log then takes over. What the JVM
prints before its first line (the launcher's ``WARNING: Using incubator modules``, log4j's
default-profile line, the SparkContext's first three INFO lines, a native-library warning, and a
hostname warning unless ``SPARK_LOCAL_IP`` is set) no script can hold back: ``--driver-java-options
-Dlog4j2.configurationFile=...`` sends all but the first elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import MutableMapping
from datetime import date
from pathlib import Path

from pipeline.atomic import write_text_atomic
from pipeline.ingest.job import failure_message, load_job_configs, run_backfill, run_nightly
from pipeline.ingest.progress import print_summary
from pipeline.ingest.session import launched_by_spark_submit

# Spark's level while the SparkContext starts under spark-submit, until the run log takes over at
# [spark].log_level: the ~120 INFO lines of its start-up (a local cluster's master and workers too)
# would bury the job's own.
START_UP_LOG_LEVEL = "ERROR"


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


def absolute_pyspark_python(environ: MutableMapping[str, str], cwd: Path) -> None:
    """Make a relative ``PYSPARK_PYTHON`` (``.venv/bin/python``) absolute against ``cwd``, the
    directory spark-submit was started in. The driver reads it when the SparkContext starts and
    ships it to every executor, which starts it in its own working directory (a local-cluster
    worker's ``work/app-*/N``), where a relative path names nothing: ``error=2`` on every task.
    A bare name (``python3``) is looked up on the PATH and stays as it is."""
    python = environ.get("PYSPARK_PYTHON")
    if python and os.sep in python and not os.path.isabs(python):
        environ["PYSPARK_PYTHON"] = str(cwd / python)


def quiet_spark_submit_start_up() -> None:
    """Under spark-submit, have the SparkContext start at ``START_UP_LOG_LEVEL`` (Spark's
    ``spark.log.level``, read from the JVM's system properties as spark-submit's ``--conf`` are),
    unless the command line set a level. A JVM the job starts itself logs to the run log from its
    first line and needs nothing."""
    if not launched_by_spark_submit():
        return
    from pyspark import SparkContext

    SparkContext._ensure_initialized()  # joins spark-submit's JVM, as the session's getOrCreate would
    system = SparkContext._jvm.java.lang.System
    if system.getProperty("spark.log.level") is None:
        system.setProperty("spark.log.level", START_UP_LOG_LEVEL)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    absolute_pyspark_python(os.environ, Path.cwd())
    quiet_spark_submit_start_up()
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
