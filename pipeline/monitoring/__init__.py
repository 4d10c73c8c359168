"""Live-model monitoring: how the model versions that decided a day's payments actually performed.

``fraudctl monitor --date D`` and the nightly ``monitor`` stage call :func:`pipeline.monitoring.monitor.run_monitor`:
the first decision per payment of day ``D`` on the scores topic, labelled with the fraud reports the
raw store holds from by ``D + label_maturity_days``, judged per model version against what the version
promised (its operating points, its validation scores, its training split).

* ``config``: the typed slice ``conf/<env>/monitoring.toml``;
* ``join``: pure: score events -> first decisions, reports -> labels, with the accounting of what was left out and why;
* ``figures``, ``drift``: pure: per-version metrics at the operating points, score and feature PSI;
* ``history``: the per-version record of monitored days and the ``degraded`` rule over it;
* ``sources``: the adapters that read Kafka, the raw store and the registry;
* ``report``, ``plot``, ``tracking``: what a run writes (report.json, a PNG, MLflow metrics);
* ``monitor``: the order of effects.
"""
