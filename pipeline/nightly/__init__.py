"""One production night: ingest -> train -> register -> gate -> monitor -> report, composed once.

:mod:`pipeline.nightly.cycle` runs the chain (``fraudctl nightly``, ``make demo``); the DAGs in
``airflow_dags/`` run its stages one task each. Every stage takes the previous stage's output as
an explicit record (:mod:`pipeline.nightly.records`): dataset version -> run directory -> model
version -> gate decision -> the live model's figures on the day whose reports matured.
"""
