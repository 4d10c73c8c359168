"""The demo's scoring-service step: the real ``fraudctl serve`` beside the night, then live payments.

Order of effects within :func:`pipeline.demo.run.run_demo` (inside the broker's lifetime, so the
broker stops last):

1. before the cycle, if the registry has a champion, ``fraudctl serve`` starts as a child process
   on a free 127.0.0.1 port, consuming the demo's broker (``KAFKA_BOOTSTRAP_SERVERS``) and serving
   that champion; a thread notes each model version its ``/health`` reports;
2. the production cycle runs beside it, untouched; when its gate promotes, the service's alias poll
   loads the new champion and swaps it in without a restart (the hot reload the summary reports,
   with its delay after the gate's decision);
3. after the cycle (on the first night only now, once the gate made a first champion): ``/ready``,
   then a handful of the *next* day's simulated payments (tomorrow night publishes the same ones to
   Kafka), frauds among them by the simulator's truth, go to ``POST /score`` one at a time, and each
   decision is printed;
4. leaving the step stops the process it started (SIGTERM, SIGKILL after a grace period), whatever
   happened. Nothing else is touched: the registry is only read.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from pipeline.decisions.operating_points import OperatingPoints, operating_points_from_tags
from pipeline.kafka.settings import KafkaConfig
from pipeline.nightly.records import GateOutcome, NightLedger, NightReport
from pipeline.registry.config import RegistryConfig
from pipeline.serving.config import ADMIN_TOKEN_ENV, load_serving_config
from pipeline.serving.http_bodies import BATCH_FIELD
from pipeline.serving.process import ServerProcess, ServiceFailed
from pipeline.simulation import GENUINE, PATTERNS, Simulation

READY_TIMEOUT_S = 300.0  # imports, model load and feature seeding on a busy 2-core machine
RELOAD_GRACE_S = 60.0  # beyond one alias poll: fetching and warming up the new version
WATCH_INTERVAL_S = 0.5
LIVE_PAYMENTS = 8
LIVE_FRAUDS = 3  # of distinct patterns, where the day has that many
STOPPING = ("review", "block")  # decisions that keep a payment from going through unchecked
EXPLICIT = "the explicit thresholds of serving.toml (the version ships no operating points)"

Echo = Callable[[str], None]


@dataclass(frozen=True)
class LivePayment:
    event: dict[str, Any]  # the contract event posted to /score
    pattern: str  # the simulator's truth: "genuine" or the fraud pattern (never sent)

    @property
    def is_fraud(self) -> bool:
        return self.pattern != GENUINE


@dataclass(frozen=True)
class ServingFigures:
    """What the summary says about the service: the whole live day, and the payments shown."""

    day: str  # the live day scored (the next day's traffic)
    requests: int  # payments scored
    decisions: dict[str, int]  # decision -> count, over the whole day
    day_frauds: int  # the simulator's truth, never sent
    day_frauds_stopped: int  # of those, decided review or block
    day_frauds_reported: int  # payments labelled fraud by the day's label cutoff (the holdout's definition)
    day_frauds_reported_stopped: int  # of those, decided review or block
    frauds_sent: int  # among the payments shown
    frauds_stopped: int  # shown frauds decided review or block
    version: int  # the version that decided the live payments
    operating_points: str  # the version's thresholds and the budget they come from
    review_budget: float | None  # the version's review budget (None: explicit thresholds)
    reload: str  # the hot reload seen, or why there was none
    log: Path

    @property
    def flagged_share(self) -> float:
        return sum(self.decisions.get(d, 0) for d in STOPPING) / self.requests if self.requests else float("nan")


def pick_live_payments(sim: Simulation, total: int = LIVE_PAYMENTS, frauds: int = LIVE_FRAUDS) -> list[LivePayment]:
    """Up to ``frauds`` frauds of distinct patterns (the middle one of each) and genuine payments spread
    over the day to make ``total``, in event-time order (as they would arrive)."""
    patterns = sim.truth["pattern"].to_numpy()
    by_pattern = [np.flatnonzero(patterns == p) for p in PATTERNS]
    chosen = [int(rows[len(rows) // 2]) for rows in by_pattern if len(rows)][:frauds]
    genuine = np.flatnonzero(patterns == GENUINE)
    step = max(len(genuine) // (total - len(chosen) + 1), 1)
    chosen += [int(i) for i in genuine[step::step][: total - len(chosen)]]
    records = list(sim.transaction_records())  # same row order as truth, sorted by event time
    return [LivePayment(records[i], str(patterns[i])) for i in sorted(chosen)]


def decision_line(payment: LivePayment, answer: dict[str, Any]) -> str:
    """One scored payment: id, amount, truth, score, decision, model version, why."""
    truth = f"fraud ({payment.pattern})" if payment.is_fraud else "genuine"
    reasons = answer["reasons"]
    why = [f"by {reasons['decided_by']}", *reasons["rules"]]
    top = ", ".join(f"{a['feature']} {a['contribution']:+.3f}" for a in reasons["top_features"])
    return (f"   {answer['transaction_id']}  {payment.event['amount']:>9.2f} {payment.event['currency']}  "
            f"{truth:<30} score {answer['score']:.3f}  {answer['decision']:<6}  v{answer['model_version']}  "
            f"{'; '.join(why)}" + (f"; top features: {top}" if top else ""))


def serving_summary(served: ServingFigures | None) -> list[str]:
    """The service's lines of the demo's summary."""
    if served is None:
        return ["   scoring service: not started (no champion yet)"]
    decisions = ", ".join(f"{n} {d}" for d, n in sorted(served.decisions.items()))
    budget = (f" against a review budget of {served.review_budget:.2%}" if served.review_budget is not None
              else " (explicit thresholds: no budget)")
    return [f"   scoring service: {served.requests} live payments of {served.day} scored by v{served.version} "
            f"({decisions}): {served.flagged_share:.2%} sent to review or blocked{budget}",
            f"   operating points of v{served.version}: {served.operating_points}",
            f"   frauds: {served.day_frauds_stopped} of the day's {served.day_frauds} frauds sent to review or blocked "
            f"({served.day_frauds_reported_stopped} of the {served.day_frauds_reported} reported within the label "
            f"maturity); {served.frauds_stopped} of the {served.frauds_sent} frauds shown",
            f"   {served.reload}; stopped, log {served.log}"]


def reload_timing(loaded_at: float, gate_recorded_at: float) -> str:
    """When the promoted version went live, against the gate's ledger record (written after the gate has
    moved the alias, so a service polling between the two loads the version before the record exists)."""
    delay = loaded_at - gate_recorded_at
    if delay < 0:
        return "live before the gate had finished recording its decision (it moves the alias, then records)"
    return f"live {delay:.1f}s after the gate's decision"


def service_process(env: str, kafka: KafkaConfig, log: Path) -> ServerProcess:
    """``fraudctl serve`` for the demo (not started): conf ``env``, the demo's broker, admin endpoints off."""
    environment = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                   ADMIN_TOKEN_ENV: ""}  # the demo only scores and watches
    return ServerProcess.fraudctl_serve(environment, log, env=env)


class VersionWatch:
    """Polls ``/health`` from a daemon thread and keeps each change of the served model version."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.versions: list[int] = []  # in the order the service served them
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-version-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10.0)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=2.0) as http:
            while not self._stop.wait(WATCH_INTERVAL_S):
                try:
                    version = http.get("/health").json()["model"]["version"]
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    continue  # not listening yet, or going away
                if version is not None and (not self.versions or self.versions[-1] != version):
                    self.versions.append(version)


class ServingStep:
    """The demo's scoring service for one night; leaving the ``with`` block stops what it started."""

    def __init__(self, env: str, kafka: KafkaConfig, registry: RegistryConfig, workdir: Path, echo: Echo) -> None:
        self.env, self.kafka, self.registry, self.echo = env, kafka, registry, echo
        self.log = workdir / "serving.log"
        serving = load_serving_config(env)
        self.poll_interval_s = serving.model.poll_interval_s
        self.max_batch_items = serving.server.max_batch_items
        self.scores_topic = serving.scores.topic
        self.service: ServerProcess | None = None
        self.watch: VersionWatch | None = None
        self.started_on: int | None = None  # the champion when the service started

    def __enter__(self) -> ServingStep:
        return self

    def __exit__(self, *_: object) -> None:
        if self.watch is not None:
            self.watch.stop()
        if self.service is not None and self.service.process is not None:
            code = self.service.stop()
            self.echo(f"   scoring service pid {self.service.process.pid} stopped (exit {code}); log {self.log}")

    def start_on_champion(self) -> None:
        """Start the service now if the registry has a champion: it then follows the night's gate."""
        champion = self._champion()
        if champion is None:
            self.echo("   no champion yet: the service starts after the gate has made one")
            return
        self._start(champion)
        self.echo(f"   serving champion v{champion} beside the night, following the alias every "
                  f"{self.poll_interval_s:g}s")

    def score_live(self, night: NightReport, day_start: date, day: Simulation, shown: list[LivePayment],
                   reported: frozenset[str]) -> ServingFigures | None:
        """Make sure the service serves the night's champion, then score the whole live ``day`` (in
        event-time order, in batches) and print the decisions of ``shown`` (chosen without their
        scores); None without a champion. ``reported``: the day's payments labelled fraud by its label
        cutoff."""
        champion = night.gate.champion_version
        if champion is None:
            self.echo("   no champion: the gate has promoted no model yet, nothing to serve")
            return None
        if self.service is None:
            self._start(champion)
        self.echo("   waiting for /ready (model loaded, online features seeded from the raw store and Kafka)")
        self.service.wait_until("/ready", timeout_s=READY_TIMEOUT_S)
        reload = self._await_champion(night, champion)
        self.echo(f"   {reload}")
        points = self._operating_points(champion)
        self.echo(f"   operating points of v{champion}: {points.describe() if points else EXPLICIT}")
        self.echo(f"   {self._tracking_line(champion)}")
        events = list(day.transaction_records())
        answers = {a["transaction_id"]: a for a in self._post_batches(events)}
        if len(answers) != len(events):
            raise ServiceFailed(f"the service answered for {len(answers)} of the live day's {len(events)} payments: "
                                f"see {self.log}")
        self.echo(f"   {len(answers)} live payments of {day_start} scored; {len(shown)} of them, chosen without "
                  "their scores (the simulator's truth shown, never sent):")
        for payment in shown:
            self.echo(decision_line(payment, answers[payment.event["transaction_id"]]))
        patterns = day.truth["pattern"].to_numpy()  # same row order as the records
        day_frauds = [answers[e["transaction_id"]] for e, p in zip(events, patterns, strict=True) if p != GENUINE]
        shown_frauds = [answers[p.event["transaction_id"]] for p in shown if p.is_fraud]
        labelled = [a for tid, a in answers.items() if tid in reported]
        return ServingFigures(
            day=day_start.isoformat(), requests=len(answers), decisions=dict(Counter(a["decision"] for a in answers.values())),
            day_frauds=len(day_frauds), day_frauds_stopped=sum(a["decision"] in STOPPING for a in day_frauds),
            day_frauds_reported=len(labelled),
            day_frauds_reported_stopped=sum(a["decision"] in STOPPING for a in labelled),
            frauds_sent=len(shown_frauds), frauds_stopped=sum(a["decision"] in STOPPING for a in shown_frauds),
            version=answers[events[-1]["transaction_id"]]["model_version"],
            operating_points=points.describe() if points else EXPLICIT,
            review_budget=points.review_budget if points else None, reload=reload, log=self.log)

    def _tracking_line(self, champion: int) -> str:
        """Where v``champion``'s review threshold stands before the live day, from /health."""
        with httpx.Client(base_url=self.service.url, timeout=5.0) as http:
            tracking = http.get("/health").json()["model"]["review_tracking"]
        if tracking.get("mode") != "live_quantile":
            return f"review threshold of v{champion}: its validation one, fixed"
        if not tracking["tracking"]:
            return (f"review threshold of v{champion}: its validation one until {tracking['window_scores']} scores "
                    f"reach the tracker's minimum (primed with {tracking['primed_scores']} of the latest payments)")
        return (f"review threshold of v{champion} now {tracking['review_threshold']:.4g}: the budget's share of its "
                f"scores on the {tracking['primed_scores']} latest payments the service saw (validation's: "
                f"{tracking['validation_threshold']:.4g})")

    def _operating_points(self, version: int) -> OperatingPoints | None:
        from pipeline.registry.store import connect

        tags = connect(self.registry).get_model_version(self.registry.model_name, str(version)).tags
        return operating_points_from_tags(tags)

    def _start(self, champion: int) -> None:
        self.service = service_process(self.env, self.kafka, self.log).start()
        self.started_on = champion
        self.watch = VersionWatch(self.service.url)
        self.watch.start()
        self.echo(f"   fraudctl serve: pid {self.service.process.pid} on {self.service.url} "
                  f"(Kafka {self.kafka.bootstrap_servers}), log {self.log}")

    def _await_champion(self, night: NightReport, champion: int) -> str:
        """Wait until the service serves ``champion``; the sentence describing the reload (or its absence)."""
        deadline = time.monotonic() + self.poll_interval_s + RELOAD_GRACE_S
        with httpx.Client(base_url=self.service.url, timeout=5.0) as http:
            model = http.get("/health").json()["model"]
            while model["version"] != champion and time.monotonic() < deadline:
                self.service.check_alive()
                time.sleep(WATCH_INTERVAL_S)
                model = http.get("/health").json()["model"]
        if model["version"] != champion:
            raise ServiceFailed(f"the service still serves v{model['version']} {RELOAD_GRACE_S:.0f}s after the "
                                f"alias poll should have loaded champion v{champion}: see {self.log}")
        served = self._versions_served(champion)
        if len(served) >= 2:
            gate = NightLedger.for_date(date.fromisoformat(night.run_date)).record_path(GateOutcome)
            return (f"hot reload: v{served[-2]} -> v{served[-1]} without a restart, "
                    f"{reload_timing(model['loaded_at'], gate.stat().st_mtime)} "
                    f"(alias polled every {self.poll_interval_s:g}s)")
        if self.started_on != champion:
            return f"serving v{champion}: the service came up after the alias moved (no reload to show)"
        if self.started_on == night.gate.compared_with:
            return f"serving champion v{champion}; no reload tonight: the gate kept it"
        return f"serving champion v{champion} (the service started after the gate made it champion)"

    def _versions_served(self, champion: int) -> list[int]:
        """The versions the service served so far, in order, ending with ``champion`` (seen just now)."""
        self.watch.stop()  # its last poll may predate the one that saw ``champion``
        return self.watch.versions if self.watch.versions[-1:] == [champion] else [*self.watch.versions, champion]

    def _post_batches(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """POST /score/batch in event-time order, as many payments a request as the service accepts."""
        answers: list[dict[str, Any]] = []
        size = self.max_batch_items
        with httpx.Client(base_url=self.service.url, timeout=120.0) as http:
            for start in range(0, len(events), size):
                response = http.post("/score/batch", json={BATCH_FIELD: events[start: start + size]})
                if response.status_code != 200:
                    raise ServiceFailed(f"POST /score/batch answered {response.status_code}: {response.text[:300]}")
                answers += response.json()["results"]
        return answers

    def _champion(self) -> int | None:
        from pipeline.registry.aliases import current_champion
        from pipeline.registry.store import connect, model_exists

        client = connect(self.registry)
        if not model_exists(client, self.registry.model_name):
            return None
        return current_champion(client, self.registry.model_name)
