"""Named failures of the scoring service. None of them stops a running service: a model that fails
to load leaves the current one serving (reported on /health and /metrics), a bad request gets a 4xx.
"""

from __future__ import annotations

from pipeline.contract import Rejection


class ServingError(RuntimeError):
    """Base class: an expected failure whose message tells the operator what to do."""


class ModelRejected(ServingError):
    """A registered version was fetched but cannot serve: its feature schema differs from what the
    service computes, or its warm-up scores are not probabilities."""


class NotReady(ServingError):
    """No model is loaded yet (no champion, or every load failed): /score answers 503."""


class RequestRefused(Exception):
    """A request the service answers with a 4xx: status and the JSON error body
    (``{"error": reason, "field": name or null, "detail": text}``, ``index`` for a batch's item)."""

    def __init__(self, status: int, error: str, detail: str, field: str | None = None, index: int | None = None):
        super().__init__(detail)
        self.status = status
        self.body = {"error": error, "field": field, "detail": detail}
        if index is not None:
            self.body["index"] = index


class PaymentRefused(RequestRefused):
    """A valid transaction event the service will not score: ingest's timing rules refuse it
    (``late_event``, ``future_event_time``). 422 with the contract's reason; the features never saw it.
    ``index``: its position among the payments scored together (the HTTP layer decides whether to show it)."""

    def __init__(self, rejection: Rejection, index: int = 0) -> None:
        super().__init__(422, rejection.reason.value, rejection.detail, rejection.field)
        self.rejection = rejection
        self.index = index
