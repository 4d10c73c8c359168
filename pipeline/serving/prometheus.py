"""Prometheus text exposition (format 0.0.4) without a client library: counters, gauges, histograms.

The service's operational counters only; model-quality metrics live in :mod:`pipeline.metrics`.

Components keep their own counts (the reloader its reloads, the rule book its refreshes, ...); the
/metrics endpoint turns their status into :class:`Family` objects at scrape time and
:func:`render` writes them. Only the request counters and latency histograms live here, because
they are updated on every request: :class:`Histogram` and :class:`Counter` are thread-safe.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]

# Seconds. Dense below 10 ms, where the service's latency objective (p99 <= 5 ms) lives.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5)


@dataclass
class Family:
    """One metric family: ``name``, ``kind`` (counter/gauge/histogram), help, and samples."""

    name: str
    kind: str
    help: str
    samples: list[tuple[str, Labels, float]] = field(default_factory=list)  # (suffix, labels, value)

    def add(self, value: float, labels: Labels = (), suffix: str = "") -> Family:
        self.samples.append((suffix, labels, value))
        return self


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def render(families: Iterable[Family]) -> str:
    lines = []
    for f in families:
        lines.append(f"# HELP {f.name} {f.help}")
        lines.append(f"# TYPE {f.name} {f.kind}")
        for suffix, labels, value in f.samples:
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(f"{f.name}{suffix}{{{label_text}}} {_number(value)}" if labels
                         else f"{f.name}{suffix} {_number(value)}")
    return "\n".join(lines) + "\n"


class Counter:
    """Monotone counts per label set."""

    def __init__(self, name: str, help: str) -> None:
        self.name, self.help = name, help
        self._values: dict[Labels, float] = {}
        self._lock = threading.Lock()

    def inc(self, labels: Labels = (), amount: float = 1.0) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def value(self, labels: Labels = ()) -> float:
        return self._values.get(labels, 0.0)

    def family(self) -> Family:
        family = Family(self.name, "counter", self.help)
        with self._lock:
            for labels, value in sorted(self._values.items()):
                family.add(value, labels)
        return family


class Histogram:
    """Cumulative-bucket histogram per label set (Prometheus semantics: ``le`` buckets, sum, count)."""

    def __init__(self, name: str, help: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.name, self.help, self.buckets = name, help, buckets
        self._counts: dict[Labels, list[int]] = {}  # per bucket (non-cumulative), last slot = +Inf
        self._sums: dict[Labels, float] = {}
        self._lock = threading.Lock()

    def observe(self, value: float, labels: Labels = ()) -> None:
        slot = bisect.bisect_left(self.buckets, value)  # first bucket with value <= le
        with self._lock:
            counts = self._counts.setdefault(labels, [0] * (len(self.buckets) + 1))
            counts[slot] += 1
            self._sums[labels] = self._sums.get(labels, 0.0) + value

    def family(self) -> Family:
        family = Family(self.name, "histogram", self.help)
        with self._lock:
            for labels, counts in sorted(self._counts.items()):
                running = 0
                for le, n in zip((*self.buckets, math.inf), counts, strict=True):
                    running += n
                    family.add(running, (*labels, ("le", _number(le))), "_bucket")
                family.add(self._sums[labels], labels, "_sum")
                family.add(running, labels, "_count")
        return family
