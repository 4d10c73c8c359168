"""The scoring routes, as FastAPI sees them: ``POST /score`` and ``POST /score/batch``.

``POST /score`` is normally answered before FastAPI by :class:`.app.ScoreRoute`; the route here
documents it in the OpenAPI spec and, if a request ever reaches it, answers through the same
``answer`` function (same limits, validation and bodies). ``POST /score/batch`` scores a whole
batch with one model version, off the event loop; a payment ingest's timing rules refuse
(:class:`.errors.PaymentRefused`), or of a card another service partition owns
(:class:`.partitioning.Misdirected`, 421), refuses the batch, with its index, before any of it is scored.
``POST /score/batch/check`` answers what /score/batch would refuse, scoring nothing: the router's
first pass over a batch split across partitions (:mod:`.router`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope

from pipeline.serving.config import ServerConfig
from pipeline.serving.errors import PaymentRefused
from pipeline.serving.http_bodies import (
    BATCH_FIELD,
    ERRORS,
    JSON,
    decode_batch,
    json_response,
    read_body,
    refusal,
    transaction_schema,
)
from pipeline.serving.partitioning import BATCH_CHECK_PATH, Misdirected
from pipeline.serving.service import ScoringService

# A partitioned service (fraudctl serve --partition I/N) refuses cards it does not own.
RESPONSES = {**ERRORS, 421: {"description": "misdirected: another scoring partition owns the card "
                                            "(owner.partition, owner.address); nothing was scored"}}

# Status and JSON body of the answer to one POST /score (ScoreRoute.answer).
ScoreAnswer = Callable[[Scope, Receive], Awaitable[tuple[int, bytes]]]


def scoring_router(service: ScoringService, server: ServerConfig, answer: ScoreAnswer) -> APIRouter:
    """The two scoring routes; refusals raise :class:`.http_bodies.RequestRefused` (the app's handler
    answers them) and NotReady (503)."""
    router = APIRouter()

    @router.post("/score", responses=RESPONSES, openapi_extra={"requestBody": {
        "required": True, "content": {JSON: {"schema": transaction_schema()}}}})
    async def score(request: Request) -> Response:
        """Score one transaction: score, decision (allow/review/block), model_version, reasons."""
        status, body = await answer(request.scope, request.receive)  # served by ScoreRoute first
        return Response(body, status_code=status, media_type=JSON)

    @router.post("/score/batch", responses=RESPONSES, openapi_extra={"requestBody": {"required": True, "content": {
        JSON: {"schema": {"type": "object", "required": [BATCH_FIELD],
                          "properties": {BATCH_FIELD: {"type": "array", "items": transaction_schema()}}}}}}})
    async def score_batch(request: Request) -> Response:
        """Score many transactions with one model version; the first invalid or mistimed one refuses the batch."""
        events = decode_batch(await read_body(request.scope, request.receive, server.max_batch_bytes),
                              server.max_batch_items)
        try:  # off the event loop: a large batch must not stall single requests behind it
            results = await run_in_threadpool(service.score_batch, events)
        except PaymentRefused as exc:  # nothing of the batch was scored: name the item, as decode_batch does
            raise refusal(exc.rejection, exc.index) from None
        except Misdirected as exc:
            raise exc.in_batch() from None
        return json_response({"results": [r.to_dict() for r in results]})

    @router.post(BATCH_CHECK_PATH, responses=RESPONSES, openapi_extra={"requestBody": {"required": True, "content": {
        JSON: {"schema": {"type": "object", "required": [BATCH_FIELD],
                          "properties": {BATCH_FIELD: {"type": "array", "items": transaction_schema()}}}}}}})
    async def check_batch(request: Request) -> Response:
        """Check a batch as /score/batch would now, scoring and remembering nothing: ``{"checked": n}``,
        or the refusal /score/batch would answer. The router asks every partition of a split batch
        this before any of them scores it."""
        events = decode_batch(await read_body(request.scope, request.receive, server.max_batch_bytes),
                              server.max_batch_items)
        try:  # off the event loop: it waits for the features' lock, which a scoring batch holds
            await run_in_threadpool(service.check_batch, events)
        except PaymentRefused as exc:
            raise refusal(exc.rejection, exc.index) from None
        except Misdirected as exc:
            raise exc.in_batch() from None
        return json_response({"checked": len(events)})

    return router
