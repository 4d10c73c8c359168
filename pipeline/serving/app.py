"""The HTTP face of the scoring service (FastAPI, served by uvicorn; OpenAPI docs at /docs).

=======================  =====================================================================
``POST /score``          one transaction (event contract v1) -> score, decision, model version, reasons
``POST /score/batch``    ``{"transactions": [...]}`` -> ``{"results": [...]}`` (one model version)
``GET /health``          model version, loaded at, last reload error, rules, features, stream, scores
``GET /ready``           200 once a model is live and the features are seeded, else 503
``GET /metrics``         Prometheus text
``POST /admin/reload``   re-read the alias and reload (even the same version)      } Bearer token
``POST /admin/pin``      ``?version=N`` serve N whatever the alias; no version: follow it again }
``POST /admin/rules/refresh``  re-read the rules file now                         }
=======================  =====================================================================

Bad input never reaches the model and never yields a 5xx: a body over the configured limit is 413
(refused from Content-Length before it is read, or as soon as the stream passes the limit); a
body the contract refuses is 400 (``malformed_json``) or 422 (every other reason), with the
contract's reason, field and detail. 503 means no model is live yet.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pipeline.contract import FIELDS_BY_KIND, Kind, Rejection, RejectReason, validate_event, validate_object
from pipeline.serving.config import AdminConfig, ServerConfig
from pipeline.serving.errors import NotReady, ServingError
from pipeline.serving.metrics import render
from pipeline.serving.service import ScoringService
from pipeline.serving.telemetry import HttpMetrics, service_families

log = logging.getLogger(__name__)

JSON = "application/json"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
BATCH_FIELD = "transactions"


class RequestRefused(Exception):
    """A request the service answers with a 4xx: status and the JSON error body."""

    def __init__(self, status: int, error: str, detail: str, field: str | None = None, index: int | None = None):
        super().__init__(detail)
        self.status = status
        self.body = {"error": error, "field": field, "detail": detail}
        if index is not None:
            self.body["index"] = index


def refusal(rejection: Rejection, index: int | None = None) -> RequestRefused:
    status = 400 if rejection.reason is RejectReason.MALFORMED_JSON else 422
    return RequestRefused(status, rejection.reason.value, rejection.detail, rejection.field, index)


def json_response(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), status_code=status, media_type=JSON)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestRefused(413, "body_too_large", f"body of {declared} bytes is over the {limit}-byte limit")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestRefused(413, "body_too_large", f"body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_batch(raw: bytes, max_items: int) -> list[dict[str, Any]]:
    """The valid events of a batch body, or RequestRefused naming the first problem (and its index)."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # what contract.validate_event calls malformed
        raise refusal(Rejection(RejectReason.MALFORMED_JSON, None, str(exc))) from None
    if not isinstance(body, dict):
        raise refusal(Rejection(RejectReason.NOT_AN_OBJECT, None, f"expected {{\"{BATCH_FIELD}\": [...]}}"))
    items = body.get(BATCH_FIELD)
    if items is None:
        raise refusal(Rejection(RejectReason.MISSING_FIELD, BATCH_FIELD, "required field is absent"))
    if not isinstance(items, list):
        raise refusal(Rejection(RejectReason.WRONG_TYPE, BATCH_FIELD, f"expected list, got {type(items).__name__}"))
    if len(items) > max_items:
        raise RequestRefused(413, "batch_too_large", f"{len(items)} transactions; at most {max_items} per batch",
                             BATCH_FIELD)
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise refusal(Rejection(RejectReason.NOT_AN_OBJECT, None, f"got JSON {type(item).__name__}"), i)
        rejection = validate_object(item, Kind.TRANSACTION)
        if rejection is not None:
            raise refusal(rejection, i)
    return items


class TimingMiddleware:
    """Counts every request by path and status and times it (pure ASGI: no per-request task)."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.metrics.observe(scope["path"], scope["method"], status, time.perf_counter() - started)

        await self.app(scope, receive, send_and_record)


def transaction_schema() -> dict[str, Any]:
    """JSON Schema of a transaction, derived from the contract's field specs (for the OpenAPI docs)."""
    types = {"int": {"type": "integer"}, "string": {"type": "string"}, "number": {"type": "number"},
             "bool": {"type": "boolean"}, "timestamp": {"type": "string", "format": "date-time"}}
    fields = FIELDS_BY_KIND[Kind.TRANSACTION]
    return {"type": "object", "additionalProperties": True,
            "properties": {f.name: types[f.json_type] for f in fields},
            "required": [f.name for f in fields if f.required]}


ERRORS = {400: {"description": "malformed_json"}, 413: {"description": "body (or batch) over the limit"},
          422: {"description": "the event contract refused the transaction (error, field, detail)"},
          503: {"description": "no model is live yet"}}


def create_app(service: ScoringService, server: ServerConfig, admin: AdminConfig) -> FastAPI:
    """The ASGI app; its lifespan starts and stops ``service``."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(service.start)
        try:
            yield
        finally:
            await run_in_threadpool(service.stop)

    http = HttpMetrics()
    app = FastAPI(title="Fraud scoring service", lifespan=lifespan,
                  description="Scores card payments (event contract v1) with the registry's champion model.")
    app.add_middleware(TimingMiddleware, metrics=http)

    @app.exception_handler(RequestRefused)
    async def refused(_: Request, exc: RequestRefused) -> Response:
        return json_response(exc.body, exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_parameter(_: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        field = str(first.get("loc", ("", ""))[-1]) or None
        return json_response({"error": "wrong_type", "field": field, "detail": first.get("msg", str(exc))}, 422)

    @app.exception_handler(NotReady)
    async def not_ready(_: Request, exc: NotReady) -> Response:
        return json_response({"error": "not_ready", "field": None, "detail": str(exc)}, 503)

    def require_admin(request: Request) -> None:
        if not admin.token:
            raise RequestRefused(403, "admin_disabled", "admin endpoints are off: set $FRAUD_SERVING_ADMIN_TOKEN")
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {admin.token}".encode()):
            raise RequestRefused(401, "unauthorized", "admin endpoints need 'Authorization: Bearer <token>'")

    @app.post("/score", responses=ERRORS, openapi_extra={"requestBody": {
        "required": True, "content": {JSON: {"schema": transaction_schema()}}}})
    async def score(request: Request) -> Response:
        """Score one transaction: score, decision (allow/review/block), model_version, reasons."""
        event, rejection = validate_event(await read_body(request, server.max_body_bytes), Kind.TRANSACTION)
        if rejection is not None:
            raise refusal(rejection)
        return json_response(service.score(event).to_dict())

    @app.post("/score/batch", responses=ERRORS, openapi_extra={"requestBody": {"required": True, "content": {JSON: {
        "schema": {"type": "object", "required": [BATCH_FIELD],
                   "properties": {BATCH_FIELD: {"type": "array", "items": transaction_schema()}}}}}}})
    async def score_batch(request: Request) -> Response:
        """Score many transactions with one model version; the first invalid one refuses the batch."""
        events = decode_batch(await read_body(request, server.max_batch_bytes), server.max_batch_items)
        # Off the event loop: a large batch must not stall single requests behind it.
        results = await run_in_threadpool(service.score_batch, events)
        return json_response({"results": [r.to_dict() for r in results]})

    @app.get("/health")
    async def health() -> Response:
        """Model version, loaded at, last reload error; rules, features, stream and publisher state."""
        return json_response(service.health())

    @app.get("/ready", responses={503: {"description": "not ready, with the reasons"}})
    async def ready() -> Response:
        problems = service.readiness()
        return json_response({"ready": not problems, "not_ready": problems}, 503 if problems else 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(service_families(service, http)), media_type=PROMETHEUS)

    @app.post("/admin/reload", responses={401: {}, 403: {}})
    def admin_reload(request: Request) -> Response:
        """Re-read the alias (or pin) and reload, even the version already live."""
        require_admin(request)
        swapped = service.parts.champion.sync(force=True)
        status = service.parts.champion.status()
        return json_response({"reloaded": swapped, "model": status}, 200 if swapped else 409)

    @app.post("/admin/pin", responses={401: {}, 403: {}, 409: {"description": "the version cannot serve"}})
    def admin_pin(request: Request, version: int | None = None) -> Response:
        """Serve ``version`` whatever the alias says; without ``version``, follow the alias again."""
        require_admin(request)
        try:
            service.parts.champion.pin(version)
        except ServingError as exc:
            return json_response({"error": "pin_failed", "field": "version", "detail": str(exc)}, 409)
        return json_response({"model": service.parts.champion.status()})

    @app.post("/admin/rules/refresh", responses={401: {}, 403: {}, 409: {"description": "rules file refused"}})
    def admin_rules_refresh(request: Request) -> Response:
        """Re-read the rules file now (it is also re-read every rules.refresh_interval_s)."""
        require_admin(request)
        ok = service.parts.rules.refresh()
        return json_response({"refreshed": ok, "rules": vars(service.parts.rules.status())}, 200 if ok else 409)

    return app
