"""What GET /metrics shows: request counts and latencies (kept here, updated per request) and the
components' own counts, read from their status at scrape time.

Metric names start with ``fraud_scoring_``. Failed model loads stay visible as a counter and as
``fraud_scoring_model_load_error`` (1 while the last load attempt failed), next to the live version.
Decisions are counted per model version; the realised review and block rates of each ``[alerts]
rate_windows_s`` window (:mod:`.rates`) stand beside the live version's budget and thresholds, and
``fraud_scoring_review_rate_degraded`` is 1 while /health says degraded (:mod:`.rate_check`).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from pipeline.serving.metrics import Counter, Family, Histogram

if TYPE_CHECKING:
    from pipeline.serving.reloader import ModelReloader
    from pipeline.serving.service import ScoringService

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
    live = reloader.active
    if live is not None:
        t = live.thresholds
        for kind, value in (("review", t.review_threshold), ("block", t.block_threshold)):
            thresholds.add(value, (*labels, ("kind", kind), ("source", t.source)))
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
        feed = p.feed.status()
        consumed = Family(f"{P}stream_records_total", "counter", "Valid records applied to the features, by topic.")
        for topic, n in sorted(feed["consumed"].items()):
            consumed.add(n, (("topic", topic),))
        rejected = Family(f"{P}stream_rejected_total", "counter", "Invalid records skipped, by contract reason.")
        for reason, n in sorted(feed["rejected"].items()):
            rejected.add(n, (("reason", reason),))
        families += [consumed, rejected]
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
