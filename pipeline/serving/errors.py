"""Named failures of the scoring service. None of them stops a running service: a model that fails
to load leaves the current one serving (reported on /health and /metrics), a bad request gets a 4xx.
"""

from __future__ import annotations


class ServingError(RuntimeError):
    """Base class: an expected failure whose message tells the operator what to do."""


class ModelRejected(ServingError):
    """A registered version was fetched but cannot serve: its feature schema differs from what the
    service computes, or its warm-up scores are not probabilities."""


class NotReady(ServingError):
    """No model is loaded yet (no champion, or every load failed): /score answers 503."""
