"""The scoring service without HTTP: one payment in, a decision with its reasons out.

:meth:`ScoringService.score_batch` reads, in order: the live version (one reference, model and
thresholds, kept for the whole batch: a hot swap mid-batch changes nothing for it), the payments'
features as of their own times (the payments join the history; each sees the batch's earlier
ones), the model's scores and strongest features (one forward for the batch), the rule hits, and
the fusion policy's decisions at that version's thresholds; the decisions go to the score
publisher's queue, and the batch's flagged and blocked counts to the rate ring (:mod:`.rates`).
:meth:`score` is a batch of one. Input is already validated contract events (the HTTP layer
validates; so does the Kafka feed).

:meth:`start` loads the champion before returning (so a service that starts with a champion is
ready at once), then runs the background parts: the alias poll, the rules refresh, feature
expiry, the review-rate check (:mod:`.rate_check`), the event feed, its offset check
(:mod:`.stream_watch`) and the publisher. :meth:`stop` ends them in reverse order. :meth:`health` is
``not_ready`` before a model is live and the features are seeded, ``degraded`` while the review rate
has been outside its band too long or the event feed cannot read its topics, is out of their range or
stalled, else ``ok``. ``warnings`` name what an operator should know while scoring goes on: a version
without operating points, decisions that never reached the scores topic.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from pipeline.contract import format_rfc3339
from pipeline.decisions.prior_tracking import utc_day
from pipeline.features.online import Payment
from pipeline.features.params import FeatureParams
from pipeline.kafka.settings import KafkaConfig
from pipeline.registry.config import RegistryConfig
from pipeline.registry.store import CHALLENGER, CHAMPION
from pipeline.serving.config import ServingConfig
from pipeline.serving.decision import Decision, decide
from pipeline.serving.errors import NotReady
from pipeline.serving.features import FeatureStore, PaymentTimeRules, payment_from_event, warmup_rows
from pipeline.serving.model_source import RegistryModelSource
from pipeline.serving.partitioning import Ownership
from pipeline.serving.periodic import Periodic
from pipeline.serving.prometheus import Counter
from pipeline.serving.publisher import ScorePublisher
from pipeline.serving.rate_check import ReviewRateCheck
from pipeline.serving.rates import DecisionRates
from pipeline.serving.recent_traffic import RecentTraffic
from pipeline.serving.reloader import LiveVersion, ModelReloader
from pipeline.serving.rules import RuleBook, RuleSet
from pipeline.serving.score_event import ScoreEvent
from pipeline.serving.scorer import Attribution, Scored
from pipeline.serving.stream import EventFeed
from pipeline.serving.thresholds import Thresholds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reasons:
    """Why: what decided (blocklist, allowlist, score, no_score), the rule hits, the thresholds the
    score reached, and the features that moved the score most (see :mod:`pipeline.serving.scorer`)."""

    decided_by: str
    rules: tuple[str, ...]
    thresholds: tuple[str, ...]
    top_features: tuple[Attribution, ...]


@dataclass(frozen=True)
class ScoreResult:
    """The answer to one scoring request (the body of a 200 from POST /score)."""

    transaction_id: str
    score: float
    decision: Decision
    model_version: int
    reasons: Reasons
    # The score at the live fraud prior (pipeline.decisions.prior_tracking): what an analyst reads as
    # the chance of fraud. None when the version tracks no prior (the score is then the probability).
    probability: float | None = None

    def to_dict(self) -> dict[str, Any]:
        r = self.reasons
        return {"transaction_id": self.transaction_id, "score": self.score,
                "probability": self.score if self.probability is None else self.probability,
                "decision": self.decision.value, "model_version": self.model_version,
                "reasons": {"decided_by": r.decided_by, "rules": list(r.rules), "thresholds": list(r.thresholds),
                            "top_features": [a.to_dict() for a in r.top_features]}}


@dataclass
class ServiceParts:
    """The components a service is made of; ``feed``, ``publisher`` and ``shadow`` are optional."""

    champion: ModelReloader
    features: FeatureStore
    rules: RuleBook
    shadow: ModelReloader | None = None
    feed: EventFeed | None = None
    publisher: ScorePublisher | None = None


class ScoringService:
    """``clock`` (seconds, monotonic) times the rate windows and the review-rate check."""

    def __init__(self, config: ServingConfig, parts: ServiceParts, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.parts = parts
        self.decisions = Counter("fraud_scoring_decisions_total",
                                 "Decisions made, by decision, by what decided and by the model version deciding.")
        alerts = config.alerts
        self.rates = DecisionRates(max((*alerts.rate_windows_s, alerts.review_rate_window_s)), clock)
        self.review_rate_check = ReviewRateCheck(alerts, self.rates, lambda: parts.champion.active, clock)
        self.started_at: float | None = None
        self._periodic: list[Periodic] = []

    # -- life cycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        torch.set_num_threads(self.config.model.torch_threads)
        p = self.parts
        d = self.config.decision
        if d.thresholds == "config":
            log.warning('decision.thresholds = "config": every version decides with serving.toml\'s review_threshold '
                        "%g and block_threshold %g, not its own operating points (an override: no review budget, "
                        "the review rate is not checked)", d.review_threshold, d.block_threshold)
        p.rules.refresh()
        p.champion.sync()
        if p.shadow is not None:
            p.shadow.sync()
        self._periodic = [Periodic("model-poll", self.config.model.poll_interval_s, self._poll_models),
                          Periodic("rules-refresh", self.config.rules.refresh_interval_s, p.rules.refresh),
                          Periodic("feature-expiry", self.config.stream.expire_interval_s, p.features.expire),
                          Periodic("review-rate-check", self.config.alerts.check_interval_s, self.review_rate_check.check)]
        if p.feed is not None and self.config.stream.consume:
            self._periodic.append(Periodic("stream-watch", self.config.stream.watch_interval_s,
                                           p.feed.check_offsets))
        for task in self._periodic:
            task.start()
        if p.feed is not None:
            p.feed.start()
        if p.publisher is not None:
            p.publisher.start()
        self.started_at = time.time()

    def stop(self) -> None:
        p = self.parts
        for task in self._periodic:
            task.stop()
        if p.feed is not None:
            p.feed.stop()
        if p.publisher is not None:
            p.publisher.stop()

    def _poll_models(self) -> None:
        self.parts.champion.sync()
        if self.parts.shadow is not None:
            self.parts.shadow.sync()

    # -- scoring -------------------------------------------------------------------------------------
    def live_model(self) -> LiveVersion:
        live = self.parts.champion.active
        if live is None:
            error = self.parts.champion.last_error
            raise NotReady("no model is loaded yet" + (f" (last error: {error.message})" if error else
                                                       f" (no version has alias {self.parts.champion.alias!r})"))
        return live

    def score(self, event: dict[str, Any]) -> ScoreResult:
        """Decide one valid transaction event; raises NotReady when no model is live."""
        return self.score_batch((event,))[0]

    def score_batch(self, events: Sequence[dict[str, Any]]) -> list[ScoreResult]:
        """Decide many events with one model version, one feature-store pass and one forward; results
        in the request's order. Each payment's features see the batch's payments of earlier event
        times (a card's earlier payment in the batch is history for its later one), as if they had
        been scored one by one in event-time order. Raises NotReady when no model is live, and
        :class:`.partitioning.Misdirected` (nothing scored) for a card another service partition owns."""
        live = self.live_model()
        self.parts.features.ownership.check([e["card_id"] for e in events])  # Misdirected (421) before anything
        payments = [payment_from_event(e) for e in events]
        rows = self.parts.features.score_features_many(payments)
        rules = self.parts.rules.rules  # one rule set for the batch, like one model
        scored_at = format_rfc3339(datetime.now(UTC))
        scores = live.scorer.score_many(rows)
        thresholds = live.deciding()  # one pair for the whole batch, its decisions and its counts
        days = [utc_day(p.ts_us) for p in payments]
        probabilities = live.probabilities([s.score for s in scores], days)
        results = [self._decide(live, thresholds, rules, event, payment, features, scored, probability, scored_at)
                   for event, payment, features, scored, probability
                   in zip(events, payments, rows, scores, probabilities, strict=True)]
        self._count_rates(thresholds, scores)
        live.observe([s.score for s in scores], days)
        return results

    def check_batch(self, events: Sequence[dict[str, Any]]) -> None:
        """Raise what :meth:`score_batch` would raise for ``events`` now (NotReady, Misdirected,
        PaymentRefused), scoring, remembering and publishing nothing."""
        self.live_model()
        self.parts.features.ownership.check([e["card_id"] for e in events])
        self.parts.features.check_many([payment_from_event(e) for e in events])

    def _decide(self, live: LiveVersion, thresholds: Thresholds, rules: RuleSet, event: dict[str, Any],
                payment: Payment, features: dict[str, float | int], scored: Scored, probability: float | None,
                scored_at: str) -> ScoreResult:
        hits = rules.match(payment.card_id, payment.merchant_id, event.get("device_id"))
        verdict = decide(scored.score, hits, thresholds, self.config.decision.allowlist_override)
        self.decisions.inc((("decision", verdict.decision.value), ("decided_by", verdict.decided_by),
                            ("version", str(live.version))))
        hit_names = tuple(str(h) for h in hits)
        if self.parts.publisher is not None:
            self.parts.publisher.submit(ScoreEvent(
                transaction_id=payment.transaction_id, card_id=payment.card_id, event_time=event["event_time"],
                model_version=live.version, score=scored.score, decision=verdict.decision.value,
                decided_by=verdict.decided_by, rules=hit_names, thresholds=verdict.thresholds, features=features,
                scored_at=scored_at, review_threshold=thresholds.review_threshold,
                block_threshold=thresholds.block_threshold, probability=probability), hits)
        return ScoreResult(payment.transaction_id, scored.score, verdict.decision, live.version,
                           Reasons(verdict.decided_by, hit_names, verdict.thresholds, scored.top_features), probability)

    def _count_rates(self, thresholds: Thresholds, scores: Sequence[Scored]) -> None:
        """The batch's scores crossing the version's thresholds (not its decisions) into the rate ring."""
        review, block = thresholds.review_threshold, thresholds.block_threshold  # review <= block
        flagged = blocked = 0
        for scored in scores:
            if scored.score >= review:  # a NaN score is never flagged
                flagged += 1
                blocked += scored.score >= block
        self.rates.record(len(scores), flagged, blocked)

    # -- state ---------------------------------------------------------------------------------------
    def wait_seeded(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the features to be seeded from the raw store; True once they are
        (at once when nothing seeds them)."""
        return self.parts.feed is None or self.parts.feed.seeded.wait(timeout_s)

    def readiness(self) -> list[str]:
        """Why the service is not ready (empty: ready)."""
        problems = []
        if self.parts.champion.active is None:
            problems.append("no model loaded")
        if self.parts.feed is not None and not self.parts.feed.seeded.is_set():
            problems.append("online features are still being seeded from the raw store")
        return problems

    def health(self) -> dict[str, Any]:
        """GET /health: ``status`` (not_ready > degraded > ok) with its reasons, then each part's status."""
        p = self.parts
        not_ready = self.readiness()
        check = self.review_rate_check.check()
        stream = p.feed.status() if p.feed else None
        degraded = ([check.reason] if check.state == "degraded" else []) + (stream["degraded"] if stream else [])
        live = [r.active for r in (p.champion, p.shadow) if r is not None and r.active is not None]
        warnings = [v.thresholds.warning for v in live if v.thresholds.warning]
        lost = p.publisher.lost() if p.publisher else None
        return {"status": "not_ready" if not_ready else "degraded" if degraded else "ok", "not_ready": not_ready,
                "degraded": degraded, "warnings": warnings + ([lost] if lost else []),
                "started_at": self.started_at, "model": p.champion.status(),
                "shadow": p.shadow.status() if p.shadow else None, "decision": self._decision_status(),
                "rates": {f"{w}s": c.to_dict() for w, c in self.rates.windows(self.config.alerts.rate_windows_s).items()},
                "review_rate_check": check.to_dict(), "rules": vars(p.rules.status()),
                "features": p.features.status(), "stream": stream, "partition": p.features.ownership.status(),
                "scores": p.publisher.status() if p.publisher else None}

    def _decision_status(self) -> dict[str, Any]:
        d = self.config.decision
        return {"thresholds": d.thresholds, "without_operating_points": d.without_operating_points,
                "allowlist_override": d.allowlist_override,
                "override": (f"serving.toml's review_threshold {d.review_threshold:g} and block_threshold "
                             f"{d.block_threshold:g} decide for every version" if d.thresholds == "config" else None)}


def build_service(config: ServingConfig, registry: RegistryConfig, features: FeatureParams,
                  kafka: KafkaConfig | None, raw_root: Path | None,
                  clock: Callable[[], float] = time.monotonic,
                  time_rules: PaymentTimeRules | None = None, ownership: Ownership | None = None) -> ScoringService:
    """A service for the configured registry; ``kafka=None`` runs it without the event feed and
    the scores topic, ``raw_root=None`` without seeding (features start empty). ``time_rules``
    (ingest's timing bounds, :func:`.features.payment_time_rules`) refuse mistimed payments on
    /score and skip them in the feed; None judges no time. ``ownership``: the service partition
    this process is (None: it owns every card); its feed still follows every topic partition."""
    source = RegistryModelSource(registry)
    warmup = warmup_rows(features, config.model.warmup_rows)
    tracking = config.decision.review_tracking
    recent = RecentTraffic(tracking.window) if tracking.mode == "live_quantile" else None
    champion = ModelReloader(source, CHAMPION, config.model, warmup, config.decision, recent)
    shadow = (ModelReloader(source, CHALLENGER, config.model, warmup, config.decision, recent)
              if config.model.shadow else None)
    store = FeatureStore(features, config.stream.expiry_margin_hours, time_rules, ownership=ownership, recent=recent)
    feed = None
    if kafka is not None and (config.stream.consume or config.stream.seed_from_raw_store):
        def prime_live_versions() -> None:
            for reloader in (champion, shadow):
                if reloader is not None:
                    reloader.prime_active()

        feed = EventFeed(store, kafka, config.stream, raw_root, clock, time_rules, on_seeded=prime_live_versions)
    publisher = None
    if (kafka is not None and config.scores.publish) or shadow is not None:
        publisher = ScorePublisher(config.scores, kafka, config.decision,
                                   lambda: shadow.active if shadow is not None else None)
    return ScoringService(config, ServiceParts(champion, store, RuleBook(config.rules.file()), shadow, feed, publisher),
                          clock)
