"""Prometheus text exposition: cumulative histogram buckets, label escaping, counters per label set."""

from __future__ import annotations

from pipeline.serving.prometheus import Counter, Family, Histogram, render


def test_histogram_buckets_are_cumulative_with_sum_and_count():
    h = Histogram("latency_seconds", "Latency.", buckets=(0.001, 0.01))
    for value in (0.0005, 0.001, 0.005, 0.5):
        h.observe(value, (("path", "/score"),))
    lines = render([h.family()]).splitlines()
    assert lines[:2] == ["# HELP latency_seconds Latency.", "# TYPE latency_seconds histogram"]
    assert lines[2:] == ['latency_seconds_bucket{path="/score",le="0.001"} 2',  # le is inclusive
                         'latency_seconds_bucket{path="/score",le="0.01"} 3',
                         'latency_seconds_bucket{path="/score",le="+Inf"} 4',
                         'latency_seconds_sum{path="/score"} 0.5065',
                         'latency_seconds_count{path="/score"} 4']


def test_counters_and_label_escaping():
    c = Counter("requests_total", "Requests.")
    c.inc((("path", '/a"b\\'),))
    c.inc((("path", '/a"b\\'),), 2)
    assert render([c.family()]).splitlines()[-1] == 'requests_total{path="/a\\"b\\\\"} 3'
    assert render([Family("up", "gauge", "Up.").add(1)]).splitlines()[-1] == "up 1"
