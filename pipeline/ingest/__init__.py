"""Spark ingestion: Kafka -> validated raw store -> point-in-time features -> manifested datasets.

Entry points: :mod:`pipeline.ingest.job` (``run_nightly``, ``run_backfill``, ``run_raw_ingest``),
``jobs/ingest.py`` (spark-submit) and ``fraudctl ingest``. The story of a run, module by module:

* ``offsets`` plans ``[committed, end)`` per partition (end from ``pipeline.kafka.admin.end_offsets``);
* ``kafka_source`` reads the ranges on the executors (a PySpark Python data source);
* ``landing`` validates (``validate``, contract-exact), screens timing (``timing``) and writes
  Parquet from inside the read tasks; ``duplicates`` then moves repeated identities to quarantine;
* ``accounting`` checks read = valid + quarantined + duplicates against the files, and the run
  commits (offsets, run id, watermarks) with one atomic replace of the commit log (``offsets``);
  ``raw_layout`` is the store's layout and listing, ``raw_reader`` its one Arrow reader (no Spark),
  ``raw_store`` its Spark readers;
* ``dataset_plan`` fixes dates, splits and label cutoff; ``dataset_builder`` computes features
  (``pipeline.features``), writes deterministic shards (``shards``) and publishes the manifest.
"""
