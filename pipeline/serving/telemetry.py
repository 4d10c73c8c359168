"""What GET /metrics shows: request counts and latencies (kept here, updated per request) and the
components' own counts, read from their status at scrape time.

Metric names start with ``fraud_scoring_``. Failed model loads stay visible as a counter and as
``fraud_scoring_model_load_error`` (1 while the last load attempt failed), next to the live version.
Decisions are counted per model version; the realised review and block rates of each ``[alerts]
rate_windows_s`` window (:mod:`.rates`) stand beside the live version's budget and thresholds, and
``fraud_scoring_review_rate_degraded`` is 1 while /health says degraded (:mod:`.rate_check`).
The event feed's positions stand beside their partitions' ends; ``fraud_scoring_stream_degraded`` is 1
while one is out of range (``fraud_scoring_stream_out_of_range``, labelled with ingest's words and
remedy) or stalled (:mod:`.stream_watch`).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from pipeline.serving.prometheus import Counter, Histogram

if TYPE_CHECKING:
    from pipeline.serving.reloader import ModelReloader
    from pipeline.serving.service import ScoringService
    from pipeline.serving.stream import EventFeed
    from pipeline.serving.stream_watch import WatchReport

P = "fraud_scoring_"
# Request paths get their own label; anything else is "other" (scanners must not grow the series).
KNOWN_PATHS = frozenset({"/score", "/score/batch", "/health", "/ready", "/metrics", "/admin/reload",
                         "/admin/pin", "/admin/rules/refresh", "/docs", "/openapi.json"})
PARTITION = ("topic", "partition")


def gauge(name: str, help: str, *labels: str) -> GaugeMetricFamily:
    """An empty gauge family ``fraud_scoring_<name>`` with these label names (samples: ``add_metric``)."""
    return GaugeMetricFamily(f"{P}{name}", help, labels=labels)


def counter(name: str, help: str, *labels: str) -> CounterMetricFamily:
    """An empty counter family ``fraud_scoring_<name>`` (``name`` ends in ``_total``)."""
    return CounterMetricFamily(f"{P}{name}", help, labels=labels)


class HttpMetrics:
    def __init__(self) -> None:
        self.requests = Counter(f"{P}http_requests_total", "HTTP requests by path, method and status code.")
        self.latency = Histogram(f"{P}http_request_duration_seconds",
                                 "Time from request start to the end of the response, by path.", "path")

    def observe(self, path: str, method: str, status: int, seconds: float) -> None:
        path = path if path in KNOWN_PATHS else "other"
        self.requests.inc((("path", path), ("method", method), ("status", str(status))))
        self.latency.observe(seconds, path)


def _model_families(reloader: ModelReloader, role: str) -> list[Metric]:
    status = reloader.status()
    loads = counter("model_loads_total", "Model load attempts by role and result "
                    "(success, failure of a version, alias_error: the registry could not be read).", "role", "result")
    for result in ("success", "failure", "alias_error"):
        loads.add_metric([role, result], status["loads"].get(result, 0))
    thresholds = gauge("threshold", "Score thresholds the live version decides with, by kind (review, "
                       "block) and source (version: its operating points; config: serving.toml's override; "
                       "config_fallback: it ships none).", "role", "kind", "source")
    shipped = gauge("threshold_shipped", "The review threshold the live version ships (chosen on "
                    "validation); beside fraud_scoring_threshold{kind=\"review\"} it shows how far holding the "
                    "budget on live scores has moved it.", "role", "kind")
    live = reloader.active
    if live is not None:
        t = live.deciding()
        for kind, value in (("review", t.review_threshold), ("block", t.block_threshold)):
            thresholds.add_metric([role, kind, t.source], value)
        shipped.add_metric([role, "review"], live.thresholds.review_threshold)
    error = status["last_error"]
    failing = error is not None and (status["loaded_at"] is None or error["at"] > status["loaded_at"])
    version = gauge("model_version", "Registered version serving now (0: none).", "role")
    version.add_metric([role], status["version"] or 0)
    loaded = gauge("model_loaded_timestamp_seconds", "When the live version went live.", "role")
    loaded.add_metric([role], status["loaded_at"] or 0)
    load_error = gauge("model_load_error", "1 while the most recent load attempt failed.", "role")
    load_error.add_metric([role], 1 if failing else 0)
    return [version, loaded, loads, load_error, thresholds, shipped]


def rate_families(service: ScoringService) -> list[Metric]:
    """Realised rates per window, the live version's budget beside them, and the review-rate check."""
    review = gauge("review_rate", "Share of payments scored in the window whose score reached the review "
                   "threshold of the version scoring it (blocks included); absent without payments.", "window")
    block = gauge("block_rate", "Share of payments scored in the window whose score reached the block "
                  "threshold; absent without payments.", "window")
    payments = gauge("rate_window_payments", "Payments scored in the window.", "window")
    for window, counts in service.rates.windows(service.config.alerts.rate_windows_s).items():
        label = [f"{window}s"]
        payments.add_metric(label, counts.scored)
        if counts.scored:
            review.add_metric(label, counts.review_rate)
            block.add_metric(label, counts.block_rate)
    budget = gauge("review_rate_budget", "The live version's review budget (share of payments to "
                   "flag); absent for explicit thresholds.")
    expected_block = gauge("block_rate_validation", "Share the live version's block threshold "
                           "blocked on its validation split; absent when it is not known.")
    live = service.parts.champion.active
    if live is not None and live.thresholds.budget is not None:
        budget.add_metric([], live.thresholds.budget.review_rate)
        validation = live.thresholds.points.validation if live.thresholds.points else None
        if validation is not None and not math.isnan(validation.block_rate):
            expected_block.add_metric([], validation.block_rate)
    degraded = gauge("review_rate_degraded", "1 while the review rate has been outside its band around "
                     "the budget for alerts.degraded_after_s (/health: degraded).")
    degraded.add_metric([], 1 if service.review_rate_check.check().state == "degraded" else 0)
    return [review, block, payments, budget, expected_block, degraded]


def stream_families(feed: EventFeed) -> list[Metric]:
    """The event feed: records applied and refused, then per partition its position against the topic
    (:mod:`.stream_watch`): out of range (with ingest's words and remedy), stalled, moved by the policy."""
    consumed = counter("stream_records_total", "Valid records applied to the features, by topic.", "topic")
    for topic, n in sorted(feed.consumed.items()):
        consumed.add_metric([topic], n)
    rejected = counter("stream_rejected_total", "Invalid records skipped, by contract reason.", "reason")
    for reason, n in sorted(feed.rejected.items()):
        rejected.add_metric([reason], n)
    report = feed.watch_report()
    degraded = gauge("stream_degraded", "1 while the topics cannot be read or a position is out of range or "
                     "stalled (/health: degraded).")
    degraded.add_metric([], 1 if feed.degraded(report) else 0)
    return [consumed, rejected, *_offset_families(report, feed.config.on_offset_gap), *_reset_families(report),
            degraded]


def _partition(key: tuple[str, int]) -> list[str]:
    return [key[0], str(key[1])]


def _offset_families(report: WatchReport, policy: str) -> list[Metric]:
    position = gauge("stream_position", "Next offset the feed reads, by partition.", *PARTITION)
    end = gauge("stream_end_offset", "One past the partition's last record, as last read.", *PARTITION)
    lag = gauge("stream_lag", "Records in the partition beyond the feed's position.", *PARTITION)
    stalled = gauge("stream_stalled", "1 while the position has not moved for stream.stall_after_s "
                    "while the partition's end grew.", *PARTITION)
    for key, (pos, _, high) in sorted(report.offsets.items()):
        position.add_metric(_partition(key), pos)
        end.add_metric(_partition(key), high)
        lag.add_metric(_partition(key), max(0, high - pos))
        stalled.add_metric(_partition(key), 1 if any((s.topic, s.partition) == key for s in report.stalls) else 0)
    gaps = gauge("stream_out_of_range", "1 for a position before the partition's earliest offset or "
                 "beyond its end; detail: ingest's error for the same offsets, with its remedy; policy: "
                 "stream.on_offset_gap.", *PARTITION, "position", "earliest", "end", "policy", "detail")
    for g in report.gaps:
        gaps.add_metric([*_partition((g.topic, g.partition)), str(g.position), str(g.low), str(g.high), policy,
                         g.detail], 1)
    return [position, end, lag, stalled, gaps]


def _reset_families(report: WatchReport) -> list[Metric]:
    resets = counter("stream_offset_resets_total", "Out-of-range positions moved to the earliest "
                     'offset (stream.on_offset_gap = "earliest").', *PARTITION)
    skipped = counter("stream_skipped_records_total", "Records known lost to those moves (deleted "
                      "unread; a recreated topic's lost records cannot be counted).", *PARTITION)
    for key, n in sorted(report.resets_total.items()):
        resets.add_metric(_partition(key), n)
        skipped.add_metric(_partition(key), report.skipped_total.get(key, 0))
    last = gauge("stream_last_offset_reset_timestamp_seconds", "When each partition's position was "
                 "last moved, with the skipped range [from_offset, to_offset).", *PARTITION, "from_offset",
                 "to_offset")
    latest = {(r.topic, r.partition): r for r in report.resets}  # oldest first: the last one wins
    for key, r in sorted(latest.items()):
        last.add_metric([*_partition(key), str(r.from_offset), str(r.to_offset)], r.at)
    return [resets, skipped, last]


def _publisher_families(scores: dict[str, int]) -> list[Metric]:
    published = counter("score_events_total", "Decisions sent to the scores topic, by outcome "
                        "(queued, dropped, published, failed).", "outcome")
    for outcome in ("queued", "dropped", "published", "failed"):
        published.add_metric([outcome], scores[outcome])
    return [published,
            CounterMetricFamily(f"{P}shadow_scored_total", "Decisions the shadow model also scored.",
                                value=scores["shadow_scored"]),
            CounterMetricFamily(f"{P}shadow_disagreements_total",
                                "Decisions the shadow model would have made differently.",
                                value=scores["shadow_disagreed"])]


def service_families(service: ScoringService, http: HttpMetrics) -> list[Metric]:
    p = service.parts
    model = _model_families(p.champion, "champion")
    if p.shadow is not None:  # the same families, the shadow's samples beside the champion's
        for family, shadow in zip(model, _model_families(p.shadow, "shadow"), strict=True):
            family.samples += shadow.samples
    families = [http.requests.family(), http.latency.family(), service.decisions.family(), *model,
                *rate_families(service)]
    rules = p.rules.status()
    refreshes = counter("rules_refreshes_total", "Rule file refreshes by result.", "result")
    refreshes.add_metric(["success"], rules.refreshes)
    refreshes.add_metric(["failure"], rules.failures)
    entries = gauge("rules_entries", "Entries on each list (action.subject).", "list")
    for key, n in sorted(rules.counts.items()):
        entries.add_metric([key], n)
    features = p.features.status()
    size = gauge("feature_state_entries", "Entries held by the online feature state.", "kind")
    for key in ("cards", "merchants", "payments", "card_events", "fraud_reports"):
        size.add_metric([key], features[key])
    families += [refreshes, entries, size]
    if p.feed is not None:
        families += stream_families(p.feed)
    if p.publisher is not None:
        families += _publisher_families(p.publisher.status())
    families.append(GaugeMetricFamily(f"{P}uptime_seconds", "Seconds since the service started.",
                                      value=time.time() - service.started_at if service.started_at else 0))
    return families
