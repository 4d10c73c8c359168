"""The service's /metrics through ``prometheus_client``: one registry per service instance, filled by
a custom collector that builds the metric families at scrape time.

The service's operational counters only; model-quality metrics live in :mod:`pipeline.metrics`.

Components keep their own counts (the reloader its reloads, the rule book its refreshes, ...); at
scrape time :mod:`.telemetry` turns their status into ``prometheus_client`` metric families and the
library writes the text format (escaping of HELP text and label values included). Only the request
counters and latency histograms live here, because they are updated on every request:
:class:`Counter` and :class:`Histogram` are thread-safe.

Why not the library's own ``Counter``/``Histogram`` instruments: they need their label names when
built (the decisions counter learns its labels per decision) and add ``*_created`` series that the
scrape never had; keeping the counts here and handing them to the library as families at scrape
time keeps every series as it was. Why a registry per instance: two services in one process (the
tests start several) must not share, or collide in, the global ``REGISTRY``.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

Labels = tuple[tuple[str, str], ...]

# The text format the library writes (version 0.0.4), for the response's Content-Type.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# Seconds. Dense below 10 ms, where the service's latency objective (p99 <= 5 ms) lives.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5)


class ScrapeCollector(Collector):
    """A custom collector: ``families()`` is called on every scrape and its families are exposed as-is."""

    def __init__(self, families: Callable[[], Iterable[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(list(self._families()))


def service_registry(families: Callable[[], Iterable[Metric]]) -> CollectorRegistry:
    """A registry of its own (not the global one) whose only collector is ``families``.
    ``auto_describe`` stays off: describing would call ``families()`` once at registration."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapeCollector(families))
    return registry


def render(registry: Collector) -> str:
    """The text exposition (format 0.0.4) of everything ``registry`` collects."""
    return generate_latest(registry).decode()


def _label_names(labels: Labels) -> list[str]:
    return [name for name, _ in labels]


def _label_values(labels: Labels) -> list[str]:
    return [value for _, value in labels]


class Counter:
    """Monotone counts per label set; every label set of one counter has the same label names."""

    def __init__(self, name: str, help: str) -> None:
        self.name, self.help = name, help
        self._values: dict[Labels, float] = {}
        self._lock = threading.Lock()

    def inc(self, labels: Labels = (), amount: float = 1.0) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def value(self, labels: Labels = ()) -> float:
        return self._values.get(labels, 0.0)

    def family(self) -> CounterMetricFamily:
        with self._lock:
            values = sorted(self._values.items())
        family = CounterMetricFamily(self.name, self.help, labels=_label_names(values[0][0]) if values else ())
        for labels, value in values:
            family.add_metric(_label_values(labels), value)
        return family


class Histogram:
    """Bucket counts per label set; the library writes them as cumulative ``le`` buckets, sum and count."""

    def __init__(self, name: str, help: str, label: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.name, self.help, self.label, self.buckets = name, help, label, buckets
        self._counts: dict[str, list[int]] = {}  # per bucket (not cumulative), last slot = +Inf
        self._sums: dict[str, float] = {}
        self._lock = threading.Lock()

    def observe(self, value: float, label_value: str) -> None:
        slot = bisect.bisect_left(self.buckets, value)  # first bucket with value <= le
        with self._lock:
            counts = self._counts.setdefault(label_value, [0] * (len(self.buckets) + 1))
            counts[slot] += 1
            self._sums[label_value] = self._sums.get(label_value, 0.0) + value

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.help, labels=[self.label])
        with self._lock:
            for label_value, counts in sorted(self._counts.items()):
                cumulative, running = [], 0
                for le, n in zip((*self.buckets, float("inf")), counts, strict=True):
                    running += n
                    cumulative.append((floatToGoString(le), running))
                family.add_metric([label_value], cumulative, self._sums[label_value])
        return family
