"""Read a /metrics scrape with prometheus_client's own text parser, so tests assert on series and
values, not on the library's choice of label order or number spelling."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Series = tuple[str, frozenset[tuple[str, str]]]


def samples(text: str) -> dict[Series, float]:
    """Every sample of the exposition ``text``: (sample name, its labels) -> value. Raises ValueError
    where the text does not parse."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, name: str, **labels: str) -> float:
    """The value of the one sample ``name`` with exactly ``labels``; KeyError names it when absent."""
    return samples(text)[(name, frozenset(labels.items()))]
