"""/metrics through prometheus_client: the text parses with the library's own parser, HELP text and
label values are escaped, histogram buckets are cumulative, and each service has its own registry."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.metrics_core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from pipeline.serving.prometheus import Counter, Histogram, render, service_registry
from tests.serving.conftest import app_of
from tests.serving.scrape import samples, value


def test_histogram_buckets_are_cumulative_with_sum_and_count():
    h = Histogram("latency_seconds", "Latency.", "path", buckets=(0.001, 0.01))
    for v in (0.0005, 0.001, 0.005, 0.5):
        h.observe(v, "/score")
    text = render(service_registry(lambda: [h.family()]))
    assert "# TYPE latency_seconds histogram" in text.splitlines()
    got = samples(text)
    assert got == {("latency_seconds_bucket", frozenset({("path", "/score"), ("le", "0.001")})): 2,  # le inclusive
                   ("latency_seconds_bucket", frozenset({("path", "/score"), ("le", "0.01")})): 3,
                   ("latency_seconds_bucket", frozenset({("path", "/score"), ("le", "+Inf")})): 4,
                   ("latency_seconds_sum", frozenset({("path", "/score")})): 0.5065,
                   ("latency_seconds_count", frozenset({("path", "/score")})): 4}


def test_counters_add_per_label_set_and_label_values_are_escaped():
    c = Counter("requests_total", "Requests.")
    odd = '/a"b\\\nc'  # a quote, a backslash and a newline
    c.inc((("path", odd),))
    c.inc((("path", odd),), 2)
    c.inc((("path", "/b"),))
    text = render(service_registry(lambda: [c.family()]))
    assert 'requests_total{path="/a\\"b\\\\\\nc"} 3.0' in text.splitlines()  # the format's escapes
    assert value(text, "requests_total", path=odd) == 3
    assert value(text, "requests_total", path="/b") == 1


def test_help_text_with_a_backslash_or_newline_is_escaped():
    help_text = "Share of C:\\scores\nover the budget."
    text = render(service_registry(lambda: [GaugeMetricFamily("odd_help", help_text, value=1)]))
    assert text.splitlines()[0] == "# HELP odd_help Share of C:\\\\scores\\nover the budget."
    assert len(text.splitlines()) == 3  # HELP, TYPE, the sample: the newline did not break a line
    (family,) = text_string_to_metric_families(text)
    assert (family.documentation, family.samples[0].value) == (help_text, 1)


def test_the_families_are_built_at_every_scrape():
    calls = []
    registry = service_registry(lambda: calls.append(1) or [GaugeMetricFamily("scrapes", "Scrapes.",
                                                                               value=len(calls))])
    assert calls == []  # registering does not scrape
    assert [value(render(registry), "scrapes") for _ in range(2)] == [1, 2]


def test_two_services_in_one_process_each_expose_their_own_metrics(serving_config, make_service, champion):
    with TestClient(app_of(make_service(serving_config))) as one, \
            TestClient(app_of(make_service(serving_config))) as two:
        for _ in range(3):
            one.get("/ready")
        two.get("/ready")
        texts = [one.get("/metrics").text, two.get("/metrics").text]
    ready = {"path": "/ready", "method": "GET", "status": "200"}
    assert [value(t, "fraud_scoring_http_requests_total", **ready) for t in texts] == [3, 1]
    for text in texts:  # the whole scrape parses with the library's parser, names as documented
        names = {f.name for f in text_string_to_metric_families(text)}
        assert {"fraud_scoring_http_requests", "fraud_scoring_http_request_duration_seconds",
                "fraud_scoring_model_version", "fraud_scoring_threshold", "fraud_scoring_batches",
                "fraud_scoring_uptime_seconds"} <= names
        assert value(text, "fraud_scoring_model_version", role="champion") == champion
        assert not any(name.endswith("_created") for name, _ in samples(text))
