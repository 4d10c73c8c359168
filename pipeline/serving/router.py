"""``fraudctl route``: the front of a partitioned scoring tier, routing each card to its owner.

Why a router of our own: the owner of a card is ``murmur2(card_id) % topic partitions % N``
(:mod:`.partitioning`), the Java client's hash. nginx's ``hash`` directive takes CRC32 of the key
(Cache::Memcached's arithmetic), Envoy's ring hash and Maglev take xxHash, HAProxy's ``balance hdr``
its own hashes: none computes murmur2, so none can agree with the topic without a scripting module
(nginx's njs or Lua, both packaged by Debian) in which the routing, the body parsing and the batch
split below would be written again, in another language, untested by this suite. A ``map`` from a
header the client computes would push the hash into every client. This is one small asyncio app on
uvicorn that calls :meth:`.partitioning.Ownership.owner`, the function the service itself checks
ownership with.

Routing:

* ``POST /score``: the card is the ``X-Card-Id`` header when present, else the body's ``card_id``;
  the body goes unchanged to the owner and its answer comes back unchanged (a 421 from a partition
  that disagrees included). A body without a readable ``card_id`` goes to partition 0, which answers
  the contract's 400/422 as any partition would.
* ``POST /score/batch``: the items are checked with the event contract here, so that a batch the
  service would refuse is refused whole (sent as it is to partition 0, which names the item). A
  valid batch of one owner goes to it as it is (one process: all-or-nothing). A batch split across
  owners is all-or-nothing in two passes (:meth:`Router._split_batch`): first every owner checks its
  part on ``POST /score/batch/check`` (readiness, ownership, ingest's timing rules; nothing scored
  or remembered), and a refusal there answers the batch with that item's ``index`` in the request
  while no partition has scored anything; only when every part passed are the parts scored
  concurrently and the results put back in request order.
  What stays non-atomic: the scoring pass can still fail for a part after others were scored (its
  partition died or stalled between the passes, or its watermark or clock moved a payment past
  a timing bound in those milliseconds). The client then gets that part's error (its status,
  ``error``, ``index``) plus ``results``, in request order, holding the decision of every item that
  was scored and published and ``null`` for the others, and ``unknown``, the positions whose
  partition never answered (they may yet be scored: look on the scores topic before resending).
  A non-200 batch answer without ``results`` scored nothing.
* ``GET /health``: every partition's status, ``degraded`` with ``problems`` naming each partition
  that did not answer within the deadline; ``GET /ready``: 200 once every partition is ready.

Every call to a partition has a deadline, ``[router] upstream_timeout_s`` of serving.toml
(:mod:`.upstream`): a partition that does not answer within it is a 504 naming it (index and
address), one that cannot be reached a 502. Nothing is retried: a POST /score that reached a
partition has been published to the scores topic, and a retry would publish it twice.

At start the router reads each partition's ``/health`` ``partition`` section and refuses to run
unless partition ``i`` of ``--partitions`` says it is index ``i`` of that many, all over the same
topic partition count (:func:`discover_layout`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import uvicorn
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from pipeline.contract import Kind, validate_object
from pipeline.serving.errors import RequestRefused, ServingError
from pipeline.serving.http_bodies import dumps, read_body
from pipeline.serving.partitioning import BATCH_CHECK_PATH, Ownership
from pipeline.serving.upstream import DEFAULT_TIMEOUT_S, Upstream, UpstreamFailed

log = logging.getLogger(__name__)

CARD_HEADER = b"x-card-id"
JSON_HEADERS = [(b"content-type", b"application/json")]
DISCOVER_TIMEOUT_S = 120.0


class _Keyed(msgspec.Struct):
    card_id: str


class _Batch(msgspec.Struct):
    transactions: list[msgspec.Raw]


class _Results(msgspec.Struct):
    results: list[msgspec.Raw]


@dataclass(frozen=True)
class Part:
    """The items of a batch one partition owns: their positions in the request, their raw JSON."""

    owner: int
    positions: list[int]
    items: list[bytes]

    def body(self) -> bytes:
        return b'{"transactions":[%s]}' % b",".join(self.items)


@dataclass(frozen=True)
class Answer:
    """A partition's answer to one call; ``answered`` False: the router's own 502/504 (the partition
    did not answer, so a POST's outcome is unknown)."""

    status: int
    body: bytes
    answered: bool = True


def split_batch(body: bytes, layout: Ownership) -> list[Part] | None:
    """A valid batch body split by owner (parts in owner order), or None when the batch is not
    valid under the event contract (it then goes whole to one partition, which refuses it)."""
    try:
        raw_items = msgspec.json.decode(body, type=_Batch).transactions
        items = [msgspec.json.decode(raw) for raw in raw_items]
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if any(not isinstance(item, dict) or validate_object(item, Kind.TRANSACTION) is not None for item in items):
        return None
    parts: dict[int, Part] = {}
    for i, (item, raw) in enumerate(zip(items, raw_items, strict=True)):
        owner = layout.owner(item["card_id"])
        part = parts.setdefault(owner, Part(owner, [], []))
        part.positions.append(i)
        part.items.append(bytes(raw))
    return [parts[owner] for owner in sorted(parts)]


def card_of(scope: Scope, body: bytes) -> str | None:
    """The card a /score request is for: ``X-Card-Id``, else the body's ``card_id`` (None: unreadable)."""
    for name, value in scope["headers"]:
        if name == CARD_HEADER:
            return value.decode("utf-8", "replace")
    try:
        return msgspec.json.decode(body, type=_Keyed).card_id
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


class Router:
    """The ASGI app of ``fraudctl route`` over ``upstreams`` (by partition index)."""

    def __init__(self, upstreams: list[Upstream], max_body_bytes: int, max_batch_bytes: int) -> None:
        self.upstreams = upstreams
        self.max_body_bytes, self.max_batch_bytes = max_body_bytes, max_batch_bytes
        self.layout: Ownership | None = None  # read from the partitions at start (discover_layout)
        self.routed = [0] * len(upstreams)  # scoring requests (or batch parts) sent to each partition

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        try:
            status, body = await self._answer(scope, receive)
        except ClientDisconnect:
            return
        except RequestRefused as exc:
            status, body = exc.status, dumps(exc.body)
        await send({"type": "http.response.start", "status": status,
                    "headers": [*JSON_HEADERS, (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.layout = await discover_layout(self.upstreams)
                except ServingError as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await asyncio.gather(*(upstream.close() for upstream in self.upstreams))
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _answer(self, scope: Scope, receive: Receive) -> tuple[int, bytes]:
        route = (scope["method"], scope["path"])
        if route == ("POST", "/score"):
            body = await read_body(scope, receive, self.max_body_bytes)
            card = card_of(scope, body)
            answer = await self._call(0 if card is None else self.layout.owner(card), "/score", body)
            return answer.status, answer.body
        if route == ("POST", "/score/batch"):
            return await self._batch(await read_body(scope, receive, self.max_batch_bytes))
        if route == ("GET", "/health"):
            return 200, dumps(await self.health())
        if route == ("GET", "/ready"):
            answers = await self._call_all("/ready")
            ready = all(a.status == 200 for a in answers)
            return (200 if ready else 503), dumps({"ready": ready, "partitions": [a.status for a in answers]})
        return 404, dumps({"error": "not_found", "field": None, "detail": f"the router serves POST /score, "
                           f"POST /score/batch, GET /health and GET /ready, not {scope['method']} {scope['path']}"})

    async def _call(self, index: int, path: str, body: bytes = b"", method: str = "POST") -> Answer:
        """Partition ``index``'s answer, or the router's 502/504 naming it (within the deadline)."""
        if method == "POST" and path != BATCH_CHECK_PATH:
            self.routed[index] += 1
        try:
            return Answer(*await self.upstreams[index].request(method, path, body))
        except UpstreamFailed as exc:
            log.warning("%s", exc)
            return Answer(exc.status, dumps(exc.body()), answered=False)

    async def _call_all(self, path: str) -> list[Answer]:
        return await asyncio.gather(*(self._call(i, path, method="GET") for i in range(len(self.upstreams))))

    async def _batch(self, body: bytes) -> tuple[int, bytes]:
        parts = split_batch(body, self.layout)
        if parts is None or len(parts) <= 1:  # refused whole by partition 0, or one owner: as it is
            answer = await self._call(parts[0].owner if parts else 0, "/score/batch", body)
            return answer.status, answer.body
        return await self._split_batch(parts)

    async def _split_batch(self, parts: list[Part]) -> tuple[int, bytes]:
        """Check every part, then score every part: see the module's docstring for what that guarantees."""
        checks = await asyncio.gather(*(self._call(p.owner, BATCH_CHECK_PATH, p.body()) for p in parts))
        refused = [(p, _explain_missing_check(a, self.upstreams[p.owner])) for p, a in zip(parts, checks, strict=True)
                   if a.status != 200]
        if refused:  # nothing was scored anywhere
            _, status, refusal = first_refusal(refused)
            return status, dumps(refusal)
        answers = await asyncio.gather(*(self._call(p.owner, "/score/batch", p.body()) for p in parts))
        return merge_parts(parts, answers)

    async def health(self) -> dict[str, Any]:
        """Every partition's own status; ``degraded`` with ``problems`` naming each partition that is
        not ok (or did not answer within the deadline)."""
        partitions, problems = [], []
        for i, answer in enumerate(await self._call_all("/health")):
            upstream = self.upstreams[i]
            entry = {"index": i, "address": upstream.address, "routed": self.routed[i]}
            if answer.status == 200:
                entry["status"] = json.loads(answer.body).get("status")
            elif answer.answered:
                entry.update(status=f"http_{answer.status}", detail=f"scoring partition {i} at {upstream.address} "
                             f"answered {answer.status} to GET /health: {_detail(answer.body)}")
            else:  # the router's 502/504, which names the partition
                entry.update(status="timeout" if answer.status == 504 else "unreachable", detail=_detail(answer.body))
            if entry["status"] != "ok":
                problems.append(entry.get("detail") or f"scoring partition {i} at {upstream.address} reports "
                                f"{entry['status']!r} on its /health")
            partitions.append(entry)
        return {"status": "degraded" if problems else "ok", "problems": problems, "partitions": partitions,
                "layout": None if self.layout is None else self.layout.status()}


def _detail(body: bytes) -> str:
    try:
        return str(json.loads(body).get("detail"))
    except (ValueError, AttributeError):
        return body[:200].decode("utf-8", "replace")


def _explain_missing_check(answer: Answer, upstream: Upstream) -> Answer:
    """A 404/405 to the check means a partition older than the router: say so, not "not found"."""
    if answer.answered and answer.status in (404, 405):
        return Answer(502, dumps({"error": "upstream_outdated", "field": None, "partition": {
            "index": upstream.index, "address": upstream.address}, "detail": (
                f"scoring partition {upstream.index} at {upstream.address} has no POST {BATCH_CHECK_PATH}, the "
                "router's check before a split batch is scored: it runs an older fraudctl; upgrade the "
                "partitions before the router. Nothing of the batch was scored")}))
    return answer


def _refusal(part: Part, answer: Answer) -> tuple[int, dict[str, Any]]:
    """The request position a part's refusal names (its ``index`` mapped back), and its body as a dict."""
    try:
        body = json.loads(answer.body)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return part.positions[0], {"error": "upstream_error", "field": None,
                                   "detail": answer.body[:500].decode("utf-8", "replace")}
    local = body.get("index")
    if isinstance(local, int) and 0 <= local < len(part.positions):
        return part.positions[local], {**body, "index": part.positions[local]}
    return part.positions[0], body


def first_refusal(failed: list[tuple[Part, Answer]]) -> tuple[int, int, dict[str, Any]]:
    """Position, status and body of the earliest refused item, its ``index`` the request's."""
    ranked = sorted(((*_refusal(part, answer), answer.status) for part, answer in failed), key=lambda r: r[0])
    position, body, status = ranked[0]
    return position, status, body


def merge_parts(parts: list[Part], answers: list[Answer]) -> tuple[int, bytes]:
    """The batch's answer from its parts' scoring answers: every result in request order when all
    scored; otherwise the earliest failure, with ``results`` (null where not scored) and ``unknown``
    (positions whose partition did not answer), so a client resends only what was not scored."""
    results: list[bytes | None] = [None] * sum(len(p.positions) for p in parts)
    failed, unknown = [], []
    for part, answer in zip(parts, answers, strict=True):
        if answer.status != 200:
            failed.append((part, answer))
            unknown += [] if answer.answered else part.positions
            continue
        for position, result in zip(part.positions, msgspec.json.decode(answer.body, type=_Results).results,
                                    strict=True):
            results[position] = bytes(result)
    if not failed:
        return 200, b'{"results":[%s]}' % b",".join(results)
    _, status, refusal = first_refusal(failed)
    log.error("a split batch was partly scored after every partition had checked it: %s", refusal.get("detail"))
    refusal["detail"] = (f"{refusal.get('detail')} (every partition had checked the batch, but this part failed "
                         "when scored: the items with a result in results were scored and published, resend only "
                         "the others; those in unknown may yet be scored, look on the scores topic first)")
    head = dumps({**refusal, "unknown": sorted(unknown)})[:-1]  # the results go in as they came, raw JSON
    return status, head + b',"results":[%s]}' % b",".join(b"null" if r is None else r for r in results)


async def discover_layout(upstreams: list[Upstream], timeout_s: float = DISCOVER_TIMEOUT_S) -> Ownership:
    """The tier's layout as the partitions report it on /health; ServingError unless partition ``i``
    of ``upstreams`` is index ``i`` of ``len(upstreams)``, all over one topic partition count."""
    deadline = time.monotonic() + timeout_s
    reported: list[dict[str, Any]] = []
    for i, upstream in enumerate(upstreams):
        while True:
            try:
                status, body = await upstream.request("GET", "/health")
                if status == 200:
                    reported.append(json.loads(body).get("partition") or {})
                    break
            except (UpstreamFailed, ValueError):
                pass
            if time.monotonic() > deadline:
                raise ServingError(f"scoring partition {i} at {upstream.address} did not answer GET /health "
                                   f"within {timeout_s:.0f}s: start it (fraudctl serve --partition {i}/{len(upstreams)})")
            await asyncio.sleep(0.25)
    counts = {r.get("topic_partitions") for r in reported}
    for i, r in enumerate(reported):
        if (r.get("index"), r.get("count")) != (i, len(upstreams)) or len(counts) != 1:
            raise ServingError(f"--partitions lists {upstreams[i].address} as partition {i} of {len(upstreams)}, but it "
                               f"serves {r.get('index')}/{r.get('count')} over {r.get('topic_partitions')} topic "
                               f"partitions (the others: {sorted(counts, key=str)}): list them in index order, "
                               "each started with fraudctl serve --partition I/N")
    return Ownership(0, len(upstreams), counts.pop(), tuple(u.address for u in upstreams))


def router_config(router: Router, host: str, port: int, limit_concurrency: int) -> uvicorn.Config:
    # The service's choices (server.uvicorn_config): uvloop, httptools, no access log; not imported
    # from there, which would load torch and MLflow into the router.
    return uvicorn.Config(router, host=host, port=port, limit_concurrency=limit_concurrency, loop="uvloop",
                          http="httptools", access_log=False, server_header=False, log_level="info",
                          lifespan="on", timeout_graceful_shutdown=10)


def upstreams_of(addresses: list[str], timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_connections: int = 512) -> list[Upstream]:
    """One :class:`.upstream.Upstream` per partition, by index."""
    return [Upstream(i, address, timeout_s, max_connections) for i, address in enumerate(addresses)]


def run_router(addresses: list[str], host: str, port: int, max_body_bytes: int, max_batch_bytes: int,
               limit_concurrency: int, upstream_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Route until SIGINT/SIGTERM, every call to a partition bounded by ``upstream_timeout_s``. Raises
    ServingError when it never started (a partition missing or misconfigured: the log says which)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # As many pooled connections per partition as the router takes requests: none waits for one.
    router = Router(upstreams_of(addresses, upstream_timeout_s, limit_concurrency), max_body_bytes, max_batch_bytes)
    server = uvicorn.Server(router_config(router, host, port, limit_concurrency))
    server.run()
    if not server.started:
        raise ServingError(f"the router did not start on {host}:{port}: see the log above")
