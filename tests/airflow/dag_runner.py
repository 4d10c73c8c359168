"""Runs Airflow in its own process for the DAG tests: ``python -m tests.airflow.dag_runner ...``.

Airflow reads its configuration (AIRFLOW_HOME, the metadata DB) once, at import, and takes over
logging; a process of its own keeps that away from the rest of the test session, as a worker
process keeps it away from a scheduler. The environment (airflow_env in conftest.py) holds the
temporary AIRFLOW_HOME, the SQLite metadata DB, the Spark connection and the pipeline's state
and config directories. Output: one JSON document written to ``--out``.

    structure --out F                      DagBag import errors, and per DAG its settings and tasks
    test DAG_ID LOGICAL_DATE [--conf JSON] --out F
                                           dag.test() for that logical date: run state, task states, XComs
    wait-run DAG_ID (--logical-date D | --run-type T) [--timeout S] --out F
                                           a scheduler's run (tests/airflow/deployment.py) once it has
                                           ended, or a task waits for a retry: run state, task states,
                                           tries, XComs
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any


def _dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])


def structure() -> dict[str, Any]:
    bag = _dagbag()
    dags = {}
    for dag_id, dag in bag.dags.items():
        dags[dag_id] = {
            "timetable": repr(dag.timetable),
            "max_active_runs": dag.max_active_runs,
            "catchup": dag.catchup,
            "params": sorted(dag.params.keys()),
            "tasks": {
                t.task_id: {
                    "operator": type(t).__name__,
                    "upstream": sorted(t.upstream_task_ids),
                    "retries": t.retries,
                    "retry_exponential_backoff": t.retry_exponential_backoff,
                    "retry_delay_s": t.retry_delay.total_seconds(),
                    "max_retry_delay_s": t.max_retry_delay.total_seconds() if t.max_retry_delay else None,
                } for t in dag.tasks
            },
        }
    return {"import_errors": bag.import_errors, "dags": dags}


def test_run(dag_id: str, logical_date: str, conf: dict[str, Any] | None) -> dict[str, Any]:
    from airflow.utils.session import create_session

    dag = _dagbag().get_dag(dag_id)
    run = dag.test(logical_date=datetime.fromisoformat(logical_date), run_conf=conf)
    with create_session() as session:
        return _run_result(session.merge(run), session)


def _run_result(run, session) -> dict[str, Any]:
    from airflow.models.xcom import XComModel

    tis = run.get_task_instances(session=session)
    rows = session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=run.dag_id, key="return_value")).all()
    return {"run_id": run.run_id, "state": str(run.state), "run_type": str(run.run_type),
            "logical_date": run.logical_date.isoformat() if run.logical_date else None,
            "tasks": {ti.task_id: str(ti.state) for ti in tis}, "tries": {ti.task_id: ti.try_number for ti in tis},
            "xcoms": {row.task_id: XComModel.deserialize_value(row) for row in rows}}


def wait_run(dag_id: str, logical_date: str | None, run_type: str | None, timeout_s: float) -> dict[str, Any]:
    """Poll the metadata DB until the run exists and has ended (or one of its tasks waits for a retry:
    a test whose task should not be retried must not sit out the retry delay)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import select

    deadline = time.monotonic() + timeout_s
    while True:
        with create_session() as session:
            query = select(DagRun).where(DagRun.dag_id == dag_id)
            query = (query.where(DagRun.logical_date == datetime.fromisoformat(logical_date)) if logical_date
                     else query.where(DagRun.run_type == run_type))
            run = session.scalars(query).first()
            if run is not None:
                retrying = any(ti.state == TaskInstanceState.UP_FOR_RETRY for ti in run.get_task_instances(session=session))
                if run.state in (DagRunState.SUCCESS, DagRunState.FAILED) or retrying:
                    return _run_result(run, session)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{dag_id} run ({logical_date or run_type}) not ended after {timeout_s:.0f} s: "
                               f"{'no run' if run is None else _run_result(run, session)}")
        time.sleep(2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["structure", "test", "wait-run"])
    parser.add_argument("dag_id", nargs="?")
    parser.add_argument("logical_date", nargs="?")
    parser.add_argument("--logical-date", dest="logical_date_option", default=None)
    parser.add_argument("--conf", default=None)
    parser.add_argument("--run-type", default=None)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "structure":
        result = structure()
    elif args.command == "wait-run":
        result = wait_run(args.dag_id, args.logical_date_option, args.run_type, args.timeout)
    else:
        result = test_run(args.dag_id, args.logical_date, json.loads(args.conf) if args.conf else None)
    args.out.write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
