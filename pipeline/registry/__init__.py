"""MLflow registry layer: track finished training runs, gate challengers onto ``champion``, roll back.

The storage side: runs, versions, aliases, the lock and the audit history live in MLflow. How models
are measured and the gate's decision are :mod:`pipeline.evaluation` (pure, no MLflow), which
:mod:`~pipeline.registry.promotion` and :mod:`~pipeline.registry.evaluate` call.

Entry points (the CLI in ``pipeline/cli/registry.py`` and the demo use these):

* :func:`pipeline.registry.tracking.register_run` -- log a run directory (read by
  :mod:`~pipeline.registry.training_run`) and register it as ``challenger``;
* :func:`pipeline.registry.promotion.run_gate` -- score challenger vs champion on the holdout and decide;
* :func:`pipeline.registry.rollback.rollback` / :func:`~pipeline.registry.rollback.rollback_from_checkpoint`;
* :func:`pipeline.registry.audit.read_history` -- who moved ``champion``, when and why;
* :func:`pipeline.registry.evaluate.evaluate_window` -- metrics of any model URI on any dataset window.
"""
