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

Where things are: :func:`create_app` composes the scoring router (:mod:`.routes_scoring`), the
status and admin router (:mod:`.routes_admin`), the docs pages with their assets served here, not
from a CDN (:mod:`.routes_docs`), the error handlers and the lifespan; the body
limits, batch decoding and error bodies every route shares are :mod:`.http_bodies`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pipeline.contract import Kind, validate_event
from pipeline.serving.batcher import ScoreBatcher
from pipeline.serving.config import AdminConfig, ServerConfig
from pipeline.serving.errors import NotReady
from pipeline.serving.heap import freeze_startup_heap
from pipeline.serving.http_bodies import (
    JSON,
    RequestRefused,
    dumps,
    json_response,
    not_ready_body,
    read_body,
    refusal,
)
from pipeline.serving.routes_admin import admin_router
from pipeline.serving.routes_docs import install_docs
from pipeline.serving.routes_scoring import scoring_router
from pipeline.serving.service import ScoringService
from pipeline.serving.telemetry import HttpMetrics, service_families

log = logging.getLogger(__name__)


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


def service_lifespan(service: ScoringService, batcher: ScoreBatcher,
                     freeze_heap: bool) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: start ``service`` before the first request; at shutdown close the
    scoring thread, then stop the service. With ``freeze_heap``, start-up's objects are frozen
    out of the GC once the features are seeded (:mod:`.heap`)."""

    async def freeze_heap_once_seeded() -> None:
        while not await run_in_threadpool(service.wait_seeded, 1.0):  # a second at a time: cancellable
            pass
        freeze_startup_heap()  # on the event loop: nothing else runs while it collects

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(service.start)
        freezing = asyncio.get_running_loop().create_task(freeze_heap_once_seeded()) if freeze_heap else None
        try:
            yield
        finally:
            if freezing is not None:
                freezing.cancel()
            await run_in_threadpool(batcher.close)
            await run_in_threadpool(service.stop)

    return lifespan


def install_error_handlers(app: FastAPI) -> None:
    """Refusals, bad query parameters and NotReady answer with the API's JSON error body."""

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


def create_app(service: ScoringService, server: ServerConfig, admin: AdminConfig) -> ASGIApp:
    """The ASGI app (timing, then the /score route, then FastAPI); its lifespan starts and stops
    ``service`` and the scoring thread."""
    batcher = ScoreBatcher(service.score_batch)
    http = HttpMetrics()
    app = FastAPI(title="Fraud scoring service", lifespan=service_lifespan(service, batcher, server.freeze_heap),
                  description="Scores card payments (event contract v1) with the registry's champion model.",
                  docs_url=None, redoc_url=None)  # install_docs serves both, with no CDN
    install_error_handlers(app)
    install_docs(app)
    score_route = ScoreRoute(app, batcher, server.max_body_bytes)
    app.include_router(scoring_router(service, server, score_route.answer))
    app.include_router(admin_router(service, admin, lambda: service_families(service, http) + batcher.families()))
    return TimingMiddleware(score_route, http)
