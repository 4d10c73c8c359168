"""The HTTP face of the scoring service (FastAPI, served by uvicorn; OpenAPI docs at /docs).

=======================  =====================================================================
``POST /score``          one transaction (event contract v1) -> score, decision, model version, reasons
``POST /score/batch``    ``{"transactions": [...]}`` -> ``{"results": [...]}`` (one model version)
``GET /health``          status (ok, degraded, not_ready; always 200) and why; model version, thresholds,
                         last reload error; rates, review-rate check, rules, features, stream, scores
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

``POST /score`` is the hot path: :class:`ScoreRoute`, a plain ASGI app in front of FastAPI, answers
it without FastAPI's routing, dependency and middleware layers (they cost more CPU than the
scoring itself), and hands the event to :class:`.batcher.ScoreBatcher`, which scores concurrent
requests together. FastAPI serves everything else and still documents /score (its route there
gives the same answers through the same code). :class:`TimingMiddleware` wraps both.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pipeline.contract import FIELDS_BY_KIND, Kind, Rejection, RejectReason, validate_event, validate_object
from pipeline.serving.batcher import ScoreBatcher
from pipeline.serving.config import AdminConfig, ServerConfig
from pipeline.serving.errors import NotReady, ServingError
from pipeline.serving.heap import freeze_startup_heap
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


_ENCODER = msgspec.json.Encoder()


def dumps(body: Any) -> bytes:
    """Compact JSON (msgspec: a tenth of the json module's time for a /score answer)."""
    return _ENCODER.encode(body)


def json_response(body: Any, status: int = 200) -> Response:
    return Response(dumps(body), status_code=status, media_type=JSON)


def not_ready_body(exc: NotReady) -> dict[str, Any]:
    return {"error": "not_ready", "field": None, "detail": str(exc)}


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit`` bytes;
    ClientDisconnect when the client leaves first."""
    declared = next((value for name, value in scope["headers"] if name == b"content-length"), None)
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestRefused(413, "body_too_large",
                             f"body of {declared.decode()} bytes is over the {limit}-byte limit")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestRefused(413, "body_too_large", f"body is over the {limit}-byte limit")
        chunks.append(chunk)
        if not message.get("more_body", False):
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


class ScoreRoute:
    """``POST /score`` as a plain ASGI app; every other request goes on to ``app`` (FastAPI).

    Same contract as the rest of the API: read with the body limit, validate with the event
    contract, score through ``batcher``; 4xx/503 bodies name the reason. An unexpected error is
    logged and answered 500, like FastAPI would."""

    def __init__(self, app: ASGIApp, batcher: ScoreBatcher, max_body_bytes: int) -> None:
        self.app = app
        self.batcher = batcher
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/score" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            status, body = await self.answer(scope, receive)
        except ClientDisconnect:
            return
        except Exception:
            log.exception("POST /score failed")
            status, body = 500, dumps({"error": "internal_error", "field": None, "detail": "see the service log"})
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", JSON.encode()), (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    async def answer(self, scope: Scope, receive: Receive) -> tuple[int, bytes]:
        """Status and JSON body of the answer to one POST /score."""
        try:
            event, rejection = validate_event(await read_body(scope, receive, self.max_body_bytes), Kind.TRANSACTION)
            if rejection is not None:
                raise refusal(rejection)
            result = await self.batcher.score(event)
        except RequestRefused as exc:
            return exc.status, dumps(exc.body)
        except NotReady as exc:
            return 503, dumps(not_ready_body(exc))
        return 200, dumps(result.to_dict())


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


def create_app(service: ScoringService, server: ServerConfig, admin: AdminConfig) -> ASGIApp:
    """The ASGI app (timing, then the /score route, then FastAPI); its lifespan starts and stops
    ``service`` and the scoring thread."""
    batcher = ScoreBatcher(service.score_batch)

    async def freeze_heap_once_seeded() -> None:
        while not await run_in_threadpool(service.wait_seeded, 1.0):  # a second at a time: cancellable
            pass
        freeze_startup_heap()  # on the event loop: nothing else runs while it collects

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(service.start)
        freezing = asyncio.get_running_loop().create_task(freeze_heap_once_seeded()) if server.freeze_heap else None
        try:
            yield
        finally:
            if freezing is not None:
                freezing.cancel()
            await run_in_threadpool(batcher.close)
            await run_in_threadpool(service.stop)

    http = HttpMetrics()
    app = FastAPI(title="Fraud scoring service", lifespan=lifespan,
                  description="Scores card payments (event contract v1) with the registry's champion model.")
    score_route = ScoreRoute(app, batcher, server.max_body_bytes)

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
        return json_response(not_ready_body(exc), 503)

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
        status, body = await score_route.answer(request.scope, request.receive)  # served by ScoreRoute first
        return Response(body, status_code=status, media_type=JSON)

    @app.post("/score/batch", responses=ERRORS, openapi_extra={"requestBody": {"required": True, "content": {JSON: {
        "schema": {"type": "object", "required": [BATCH_FIELD],
                   "properties": {BATCH_FIELD: {"type": "array", "items": transaction_schema()}}}}}}})
    async def score_batch(request: Request) -> Response:
        """Score many transactions with one model version; the first invalid one refuses the batch."""
        events = decode_batch(await read_body(request.scope, request.receive, server.max_batch_bytes),
                              server.max_batch_items)
        # Off the event loop: a large batch must not stall single requests behind it.
        results = await run_in_threadpool(service.score_batch, events)
        return json_response({"results": [r.to_dict() for r in results]})

    @app.get("/health")
    async def health() -> Response:
        """Status (ok, degraded: the review rate left its band; not_ready) and why; model version, thresholds,
        last reload error; realised rates, rules, features, stream and publisher state."""
        return json_response(service.health())

    @app.get("/ready", responses={503: {"description": "not ready, with the reasons"}})
    async def ready() -> Response:
        problems = service.readiness()
        return json_response({"ready": not problems, "not_ready": problems}, 503 if problems else 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(service_families(service, http) + batcher.families()), media_type=PROMETHEUS)

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

    return TimingMiddleware(score_route, http)
