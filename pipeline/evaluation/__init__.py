"""How a model is measured and judged, without the registry's storage: pure functions and the holdout's
Parquet reads, no MLflow. The gate (:mod:`pipeline.registry.promotion`), ``fraudctl evaluate``,
``fraudctl backtest`` and the benchmarks import these; nothing here imports ``pipeline.registry``, and
no module imports MLflow (``tests/evaluation/test_imports.py``).

* :mod:`~pipeline.evaluation.protocol` -- the evaluation protocol: backtest layout, known-compromised
  cards removed, card precision@k and the other figures;
* :mod:`~pipeline.evaluation.holdout` -- the gate's holdout read from a published dataset, protocol
  applied, and :func:`~pipeline.evaluation.holdout.holdout_metrics` of scores on it;
* :mod:`~pipeline.evaluation.comparison` -- challenger vs champion on the same rows: paired intervals;
* :mod:`~pipeline.evaluation.gate` -- the promotion decision, a pure function of metrics, comparison
  and :class:`~pipeline.evaluation.config.GateConfig` (:mod:`~pipeline.evaluation.config`);
* :mod:`~pipeline.evaluation.report` -- what a gate run decided, stored and printed; exit codes;
* :mod:`~pipeline.evaluation.plots` -- the PNG plots logged with a training run;
* :mod:`~pipeline.evaluation.errors` -- ``HoldoutError`` and its base ``EvaluationError``.
"""
