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

from pipeline.serving.prometheus import Counter, Family, Histogram, Labels

if TYPE_CHECKING:
    from pipeline.serving.reloader import ModelReloader
    from pipeline.serving.service import ScoringService
    from pipeline.serving.stream import EventFeed
    from pipeline.serving.stream_watch import WatchReport

P = "fraud_scoring_"
# Request paths get their own label; anything else is "other" (scanners must not grow the series).
KNOWN_PATHS = frozenset({"/score", "/score/batch", "/health", "/ready", "/metrics", "/admin/reload",
                         "/admin/pin", "/admin/rules/refresh", "/docs", "/openapi.json"})


class HttpMetrics:
    def __init__(self) -> None:
        self.requests = Counter(f"{P}http_requests_total", "HTTP requests by path, method and status code.")
        self.latency = Histogram(f"{P}http_request_duration_seconds",
                                 "Time from request start to the end of the response, by path.")

    def observe(self, path: str, method: str, status: int, seconds: float) -> None:
        path = path if path in KNOWN_PATHS else "other"
        self.requests.inc((("path", path), ("method", method), ("status", str(status))))
        self.latency.observe(seconds, (("path", path),))


def _model_families(reloader: ModelReloader, role: str) -> list[Family]:
    status = reloader.status()
    labels = (("role", role),)
    loads = Family(f"{P}model_loads_total", "counter", "Model load attempts by role and result "
                   "(success, failure of a version, alias_error: the registry could not be read).")
    for result in ("success", "failure", "alias_error"):
        loads.add(status["loads"].get(result, 0), (*labels, ("result", result)))
    thresholds = Family(f"{P}threshold", "gauge", "Score thresholds the live version decides with, by kind (review, "
                        "block) and source (version: its operating points; config: serving.toml's override; "
                        "config_fallback: it ships none).")
    shipped = Family(f"{P}threshold_shipped", "gauge", "The review threshold the live version ships (chosen on "
                     "validation); beside fraud_scoring_threshold{kind=\"review\"} it shows how far holding the "
                     "budget on live scores has moved it.")
    live = reloader.active
    if live is not None:
        t = live.deciding()
        for kind, value in (("review", t.review_threshold), ("block", t.block_threshold)):
            thresholds.add(value, (*labels, ("kind", kind), ("source", t.source)))
        shipped.add(live.thresholds.review_threshold, (*labels, ("kind", "review")))
    error = status["last_error"]
    failing = error is not None and (status["loaded_at"] is None or error["at"] > status["loaded_at"])
    return [
        Family(f"{P}model_version", "gauge", "Registered version serving now (0: none).")
        .add(status["version"] or 0, labels),
        Family(f"{P}model_loaded_timestamp_seconds", "gauge", "When the live version went live.")
        .add(status["loaded_at"] or 0, labels),
        loads,
        Family(f"{P}model_load_error", "gauge", "1 while the most recent load attempt failed.")
        .add(1 if failing else 0, labels),
        thresholds,
        shipped,
    ]


def rate_families(service: ScoringService) -> list[Family]:
    """Realised rates per window, the live version's budget beside them, and the review-rate check."""
    review = Family(f"{P}review_rate", "gauge", "Share of payments scored in the window whose score reached the "
                    "review threshold of the version scoring it (blocks included); absent without payments.")
    block = Family(f"{P}block_rate", "gauge", "Share of payments scored in the window whose score reached the block "
                   "threshold; absent without payments.")
    payments = Family(f"{P}rate_window_payments", "gauge", "Payments scored in the window.")
    for window, counts in service.rates.windows(service.config.alerts.rate_windows_s).items():
        label = (("window", f"{window}s"),)
        payments.add(counts.scored, label)
        if counts.scored:
            review.add(counts.review_rate, label)
            block.add(counts.block_rate, label)
    budget = Family(f"{P}review_rate_budget", "gauge", "The live version's review budget (share of payments to "
                    "flag); absent for explicit thresholds.")
    expected_block = Family(f"{P}block_rate_validation", "gauge", "Share the live version's block threshold "
                            "blocked on its validation split; absent when it is not known.")
    live = service.parts.champion.active
    if live is not None and live.thresholds.budget is not None:
        budget.add(live.thresholds.budget.review_rate)
        validation = live.thresholds.points.validation if live.thresholds.points else None
        if validation is not None and not math.isnan(validation.block_rate):
            expected_block.add(validation.block_rate)
    degraded = service.review_rate_check.check().state == "degraded"
    return [review, block, payments, budget, expected_block,
            Family(f"{P}review_rate_degraded", "gauge", "1 while the review rate has been outside its band around "
                   "the budget for alerts.degraded_after_s (/health: degraded).").add(1 if degraded else 0)]


def stream_families(feed: EventFeed) -> list[Family]:
    """The event feed: records applied and refused, then per partition its position against the topic
    (:mod:`.stream_watch`): out of range (with ingest's words and remedy), stalled, moved by the policy."""
    consumed = Family(f"{P}stream_records_total", "counter", "Valid records applied to the features, by topic.")
    for topic, n in sorted(feed.consumed.items()):
        consumed.add(n, (("topic", topic),))
    rejected = Family(f"{P}stream_rejected_total", "counter", "Invalid records skipped, by contract reason.")
    for reason, n in sorted(feed.rejected.items()):
        rejected.add(n, (("reason", reason),))
    report = feed.watch_report()
    return [consumed, rejected, *_offset_families(report, feed.config.on_offset_gap), *_reset_families(report),
            Family(f"{P}stream_degraded", "gauge", "1 while a position is out of range or stalled (/health: "
                   "degraded).").add(1 if report.gaps or report.stalls else 0)]


def _partition(key: tuple[str, int]) -> Labels:
    return (("topic", key[0]), ("partition", str(key[1])))


def _offset_families(report: WatchReport, policy: str) -> list[Family]:
    position = Family(f"{P}stream_position", "gauge", "Next offset the feed reads, by partition.")
    end = Family(f"{P}stream_end_offset", "gauge", "One past the partition's last record, as last read.")
    lag = Family(f"{P}stream_lag", "gauge", "Records in the partition beyond the feed's position.")
    stalled = Family(f"{P}stream_stalled", "gauge", "1 while the position has not moved for stream.stall_after_s "
                     "while the partition's end grew.")
    for key, (pos, _, high) in sorted(report.offsets.items()):
        position.add(pos, _partition(key))
        end.add(high, _partition(key))
        lag.add(max(0, high - pos), _partition(key))
        stalled.add(1 if any((s.topic, s.partition) == key for s in report.stalls) else 0, _partition(key))
    gaps = Family(f"{P}stream_out_of_range", "gauge", "1 for a position before the partition's earliest offset or "
                  "beyond its end; detail: ingest's error for the same offsets, with its remedy; policy: "
                  "stream.on_offset_gap.")
    for g in report.gaps:
        gaps.add(1, (*_partition((g.topic, g.partition)), ("position", str(g.position)), ("earliest", str(g.low)),
                     ("end", str(g.high)), ("policy", policy), ("detail", g.detail)))
    return [position, end, lag, stalled, gaps]


def _reset_families(report: WatchReport) -> list[Family]:
    resets = Family(f"{P}stream_offset_resets_total", "counter", "Out-of-range positions moved to the earliest "
                    'offset (stream.on_offset_gap = "earliest").')
    skipped = Family(f"{P}stream_skipped_records_total", "counter", "Records known lost to those moves (deleted "
                     "unread; a recreated topic's lost records cannot be counted).")
    for key, n in sorted(report.resets_total.items()):
        resets.add(n, _partition(key))
        skipped.add(report.skipped_total.get(key, 0), _partition(key))
    last = Family(f"{P}stream_last_offset_reset_timestamp_seconds", "gauge", "When each partition's position was "
                  "last moved, with the skipped range [from_offset, to_offset).")
    latest = {(r.topic, r.partition): r for r in report.resets}  # oldest first: the last one wins
    for key, r in sorted(latest.items()):
        last.add(r.at, (*_partition(key), ("from_offset", str(r.from_offset)), ("to_offset", str(r.to_offset))))
    return [resets, skipped, last]


def service_families(service: ScoringService, http: HttpMetrics) -> list[Family]:
    p = service.parts
    model = _model_families(p.champion, "champion")
    if p.shadow is not None:  # the same families, the shadow's samples beside the champion's
        for family, shadow in zip(model, _model_families(p.shadow, "shadow"), strict=True):
            family.samples += shadow.samples
    families = [http.requests.family(), http.latency.family(), service.decisions.family(), *model,
                *rate_families(service)]
    rules = p.rules.status()
    entries = Family(f"{P}rules_entries", "gauge", "Entries on each list (action.subject).")
    for key, n in sorted(rules.counts.items()):
        entries.add(n, (("list", key),))
    families += [Family(f"{P}rules_refreshes_total", "counter", "Rule file refreshes by result.")
                 .add(rules.refreshes, (("result", "success"),)).add(rules.failures, (("result", "failure"),)),
                 entries]
    features = p.features.status()
    size = Family(f"{P}feature_state_entries", "gauge", "Entries held by the online feature state.")
    for key in ("cards", "merchants", "payments", "card_events", "fraud_reports"):
        size.add(features[key], (("kind", key),))
    families.append(size)
    if p.feed is not None:
        families += stream_families(p.feed)
    if p.publisher is not None:
        scores = p.publisher.status()
        published = Family(f"{P}score_events_total", "counter",
                           "Decisions sent to the scores topic, by outcome (queued, dropped, published, failed).")
        for outcome in ("queued", "dropped", "published", "failed"):
            published.add(scores[outcome], (("outcome", outcome),))
        families += [published,
                     Family(f"{P}shadow_scored_total", "counter", "Decisions the shadow model also scored.")
                     .add(scores["shadow_scored"]),
                     Family(f"{P}shadow_disagreements_total", "counter",
                            "Decisions the shadow model would have made differently.").add(scores["shadow_disagreed"])]
    families.append(Family(f"{P}uptime_seconds", "gauge", "Seconds since the service started.")
                    .add(time.time() - service.started_at if service.started_at else 0))
    return families
