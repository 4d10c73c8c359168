"""Request bodies in, JSON answers out: the HTTP API's body limits, batch decoding and error bodies.

Shared by the /score fast path (:class:`.app.ScoreRoute`) and the FastAPI routers
(:mod:`.routes_scoring`, :mod:`.routes_admin`), so every route refuses the same input with the same
status and body. An error body is always ``{"error": reason, "field": name or null, "detail": text}``
(``index`` added for the item of a batch that refused it). A refusal is a
:class:`.errors.RequestRefused`; the feature store raises one of its own kind,
:class:`.errors.PaymentRefused` (ingest's timing rules), which every route answers the same way.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from fastapi import Response
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope

from pipeline.contract import FIELDS_BY_KIND, Kind, Rejection, RejectReason, validate_object
from pipeline.serving.errors import NotReady, RequestRefused

JSON = "application/json"
BATCH_FIELD = "transactions"


def refusal(rejection: Rejection, index: int | None = None) -> RequestRefused:
    """The event contract's rejection as a 400 (malformed JSON) or 422 (any other reason)."""
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


def transaction_schema() -> dict[str, Any]:
    """JSON Schema of a transaction, derived from the contract's field specs (for the OpenAPI docs)."""
    types = {"int": {"type": "integer"}, "string": {"type": "string"}, "number": {"type": "number"},
             "bool": {"type": "boolean"}, "timestamp": {"type": "string", "format": "date-time"}}
    fields = FIELDS_BY_KIND[Kind.TRANSACTION]
    return {"type": "object", "additionalProperties": True,
            "properties": {f.name: types[f.json_type] for f in fields},
            "required": [f.name for f in fields if f.required]}


# The OpenAPI documentation of the scoring routes' refusals.
ERRORS = {400: {"description": "malformed_json"}, 413: {"description": "body (or batch) over the limit"},
          422: {"description": "the event contract, or ingest's timing rules (late_event, future_event_time), "
                               "refused the transaction (error, field, detail)"},
          503: {"description": "no model is live yet"}}
