"""``fraudctl bench soak``: a bounded soak of ``fraudctl serve``, open loop, with a model swap and a rules refresh.

The serving benchmarks' set-up (:mod:`.served_history`: embedded broker, a simulated history on the
topics, a model of the production architecture), with two versions registered: v1 champion, v2 for
the swap. One ``fraudctl serve`` on conf/dev (an admin token set) gets ``RATE`` requests/s for
``SECONDS`` (open loop, :func:`.load.open_loop`: latency from each request's scheduled send; every
request a payment the service has not seen). Half-way, the champion alias moves
to v2 and ``POST /admin/reload`` makes it live at once, then a new rules file is written and
``POST /admin/rules/refresh`` reads it.

Fields: ``errors`` (non-200 or no answer; goal 0), ``requests``, ``p50_ms``/``p99_ms``/``p99_9_ms`` over
the whole run, ``per_minute`` (p50, p99, requests and errors of the requests scheduled in each
minute), ``p99_drift`` (the last minute's p99 against the first's), ``rss_mb`` (the service process's
resident memory after the warm-up, at the end, the largest, and ``growth``), what the swap and the
refresh answered, and the live version and rules after. The service keeps learning every payment
(its card and merchant windows, the payment index), so some growth is the history it must hold;
expiry bounds it to ``expiry_margin_hours`` behind the latest payment, which a soak of minutes of
one simulated day never reaches.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from pipeline.bench import load
from pipeline.bench.served_history import (
    CONCURRENCY,
    START_TIMEOUT_S,
    WARMUP_REQUESTS,
    publish_history,
    ready_when,
    records,
    register_model,
    service_workspace,
    set_champion,
    train_model,
)
from pipeline.kafka.broker import EmbeddedBroker
from pipeline.registry.config import RegistryConfig
from pipeline.serving.config import ADMIN_TOKEN_ENV, load_serving_config
from pipeline.serving.process import HOST, ServerProcess

RATE = 300.0  # requests/s
SECONDS = {False: 600.0, True: 60.0}
CARDS = {False: 4000, True: 1500}
RSS_EVERY_S = 5.0
ADMIN_TOKEN = "bench-soak"


def run(quick: bool) -> dict[str, Any]:
    with service_workspace("bench-soak-") as (work, env, broker):
        return _run(work, env, broker, quick)


def _prepare(broker: EmbeddedBroker, work: Path, quick: bool
             ) -> tuple[list[dict[str, Any]], list[bytes], tuple[int, int], int]:
    """History on the topics, v1 (champion) and v2 registered; the next day's payments, warm-up
    bodies, the two versions and the number of records a ready service has consumed."""
    served = publish_history(broker, CARDS[quick])
    registry = RegistryConfig()
    torch.set_num_threads(1)
    versions = (register_model(registry, train_model(served.history_features, seed=0), work),
                register_model(registry, train_model(served.history_features, seed=1), work))
    set_champion(registry, versions[0])
    payments = records(served.today)
    warmup = load.fresh_bodies(payments, WARMUP_REQUESTS, "warmup")
    return payments, warmup, versions, served.consumed


class RssSampler:
    """Resident memory of one process (MB), read from /proc every ``every_s`` in a thread."""

    def __init__(self, pid: int, every_s: float) -> None:
        self.pid, self.every_s = pid, every_s
        self.samples: list[tuple[float, float]] = []  # (seconds since start, MB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._started = time.monotonic()

    def read(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no VmRSS for process {self.pid}")

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append((round(time.monotonic() - self._started, 1), round(self.read(), 1)))

    def __enter__(self) -> RssSampler:
        self.samples.append((0.0, round(self.read(), 1)))
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((round(time.monotonic() - self._started, 1), round(self.read(), 1)))


def _swap_and_refresh(url: str, registry: RegistryConfig, to_version: int, rules_file: Path,
                      answers: dict[str, Any]) -> None:
    """Mid-run: the champion alias to ``to_version`` (live at once through /admin/reload), then a new
    rules file read through /admin/rules/refresh; their answers go into ``answers``."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30.0) as admin:
        set_champion(registry, to_version)
        started = time.monotonic()
        reload = admin.post("/admin/reload")
        answers["swap"] = {"status": reload.status_code, "seconds": round(time.monotonic() - started, 3),
                           "at_s": round(answers["clock"](), 1)}
        rules_file.parent.mkdir(parents=True, exist_ok=True)
        rules_file.write_text('[block]\ncard = ["card-soak-blocked"]\n[allow]\nmerchant = ["merchant-soak-vip"]\n')
        refresh = admin.post("/admin/rules/refresh")
        answers["rules_refresh"] = {"status": refresh.status_code, "at_s": round(answers["clock"](), 1)}


def _per_minute(samples: list[tuple[float, float, int]]) -> list[dict[str, Any]]:
    """The requests scheduled in each whole minute: count, errors, p50 and p99 (ms)."""
    minutes: dict[int, list[tuple[float, int]]] = {}
    for due, latency, status in samples:
        minutes.setdefault(int(due // 60), []).append((latency, status))
    out = []
    for minute, rows in sorted(minutes.items()):
        p50, p99 = load.percentiles_ms([latency for latency, _ in rows], 50, 99)
        out.append({"minute": minute, "requests": len(rows), "errors": sum(s != 200 for _, s in rows),
                    "p50_ms": p50, "p99_ms": p99})
    return out


def _run(work: Path, env: dict[str, str], broker: EmbeddedBroker, quick: bool) -> dict[str, Any]:
    payments, warmup, (v1, v2), consumed = _prepare(broker, work, quick)
    env[ADMIN_TOKEN_ENV] = ADMIN_TOKEN
    seconds = SECONDS[quick]
    bodies = load.fresh_bodies(payments, int(RATE * seconds), "soak")
    registry = RegistryConfig()
    rules_file = load_serving_config(path=work / "conf" / "serving.toml").rules.file()
    answers: dict[str, Any] = {}
    with ServerProcess.fraudctl_serve(env, work / "ours.log") as ours:
        ours.wait_until("/health", ready_when(v1, consumed), START_TIMEOUT_S)
        load.closed_loop(HOST, ours.port, "/score", warmup, CONCURRENCY)
        started = time.monotonic()
        answers["clock"] = lambda: time.monotonic() - started
        midway = threading.Timer(seconds / 2, _swap_and_refresh, (ours.url, registry, v2, rules_file, answers))
        with RssSampler(ours.process.pid, RSS_EVERY_S) as rss:
            midway.start()
            result = load.open_loop(HOST, ours.port, "/score", bodies, RATE, keep_samples=True)
            midway.join()
        health = httpx.get(f"{ours.url}/health").json()
    answers.pop("clock")
    minutes = _per_minute(result.pop("samples"))
    full = [m for m in minutes if m["requests"] >= 0.9 * RATE * 60] or minutes  # a last partial minute aside
    mb = [m for _, m in rss.samples]
    return {
        "rate": RATE, "seconds": seconds, **{k: result[k] for k in ("requests", "errors", "error_statuses", "gave_up", "p50_ms",
                                                                      "p99_ms", "p99_9_ms", "achieved_rps",
                                                                      "connections", "late_p99_ms")},
        "p99_drift": {"first_minute_ms": full[0]["p99_ms"], "last_minute_ms": full[-1]["p99_ms"],
                      "last_over_first": round(full[-1]["p99_ms"] / full[0]["p99_ms"], 2)},
        "rss_mb": {"after_warmup": mb[0], "end": mb[-1], "max": max(mb), "growth": round(mb[-1] - mb[0], 1),
                   "growth_share": round((mb[-1] - mb[0]) / mb[0], 3), "samples": rss.samples},
        **answers, "from_version": v1, "to_version": v2, "live_after": health["model"]["version"],
        "rules_after": health["rules"], "per_minute": minutes,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "goal": "errors == 0; bounded rss growth and p99 drift",
    }
