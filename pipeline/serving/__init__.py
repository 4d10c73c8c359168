"""The scoring service behind ``fraudctl serve``: the registry's champion, online features, rules.

Request path: :mod:`.app` (HTTP; routes in :mod:`.routes_scoring` and :mod:`.routes_admin`, bodies and
validation with the event contract in :mod:`.http_bodies`) -> :mod:`.batcher` (concurrent
requests scored together, in the scoring thread) -> :mod:`.service` (decisions) -> :mod:`.features`
(online features, the Spark job's kernel) -> :mod:`.scorer` (model, attribution) -> :mod:`.rules` +
:mod:`.decision` (fusion policy, at the version's :mod:`.thresholds`) -> :mod:`.publisher` (the
scores topic, :mod:`.score_event`); flagged and blocked counts -> :mod:`.rates`. Background:
:mod:`.reloader` (alias poll, hot swap of model and thresholds; models and operating points from
:mod:`.model_source`), :mod:`.stream` (Kafka feed, seeded by :mod:`.seed`; its positions judged by
:mod:`.stream_watch`), rules refresh, feature expiry and the review-rate check (:mod:`.periodic`,
:mod:`.rate_check`). /metrics: :mod:`.telemetry`
on :mod:`.prometheus` (prometheus_client, a registry per service). Failures: :mod:`.errors`.
Wiring: :func:`.service.build_service`; running: :mod:`.server`. Offline check: :mod:`.consistency`.
Scale-out: ``--partition I/N`` owns the cards :mod:`.partitioning` (Kafka's murmur2) assigns it
(421 for the others); :mod:`.router` (``fraudctl route``) sends each payment to its owner. The
docs pages' assets are served here (:mod:`.routes_docs`); the review threshold follows the budget on
live scores (:mod:`pipeline.decisions.review_tracking`).
Config: :mod:`.config` (``conf/<env>/serving.toml``). Operator guide: docs/scoring.md.
"""
