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
  service would refuse is refused whole (sent as it is to partition 0, which names the item); a
  valid batch is split by owner, the parts scored concurrently, the results put back in request
  order. A part a partition refuses (a payment its timing rules refuse, 422) fails the batch with
  that item's original ``index``, but the other parts were scored: unlike one process, a
  partitioned batch is not all-or-nothing for the timing rules.
* ``GET /health``: every partition's status; ``GET /ready``: 200 once every partition is ready.

Upstream connections are HTTP/1.1 keep-alive, pooled per partition (:class:`Upstream`); a pooled
connection idle for more than ``IDLE_S`` is closed rather than reused, so a request is never
written to a connection uvicorn (5 s keep-alive) may be closing. Nothing is retried: a POST
/score that reached a partition has been published to the scores topic, and a retry would publish
it twice. An unreachable partition is a 502 naming it.

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
from pipeline.serving.partitioning import Ownership

log = logging.getLogger(__name__)

IDLE_S = 2.0  # a pooled upstream connection idle longer is closed, not reused (uvicorn keeps 5 s)
CARD_HEADER = b"x-card-id"
JSON_HEADERS = [(b"content-type", b"application/json")]
DISCOVER_TIMEOUT_S = 120.0


class _Keyed(msgspec.Struct):
    card_id: str


class _Batch(msgspec.Struct):
    transactions: list[msgspec.Raw]


class _Results(msgspec.Struct):
    results: list[msgspec.Raw]


class Upstream:
    """Keep-alive HTTP/1.1 connections to one scoring partition at ``address`` (``host:port``)."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.address, self.host, self.port = address, host, int(port)
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """Status and body of one request; OSError (or IncompleteReadError) when the partition fails it."""
        reader, writer = await self._connection()
        try:
            writer.write(b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (method.encode(), path.encode(), self.host.encode(), len(body), body))
            status, answer, keep = await _read_response(reader)
        except BaseException:
            writer.close()
            raise
        if keep:
            self._idle.append((reader, writer, time.monotonic()))
        else:
            writer.close()
        return status, answer

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        now = time.monotonic()
        while self._idle:
            reader, writer, used = self._idle.pop()
            if now - used < IDLE_S and not reader.at_eof():
                return reader, writer
            writer.close()
        return await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        for _, writer, _ in self._idle:
            writer.close()
        self._idle.clear()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """Status, body and whether the connection may be reused, of one HTTP/1.1 response."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ", 2)[1])
    headers = dict(line.lower().split(": ", 1) for line in head[1:] if ": " in line)
    keep = headers.get("connection", "").lower() != "close"
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"])), keep
    chunks = []  # chunked transfer encoding
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        chunks.append((await reader.readexactly(size + 2))[:-2])
    await reader.readuntil(b"\r\n")
    return status, b"".join(chunks), keep


@dataclass(frozen=True)
class Part:
    """The items of a batch one partition owns: their positions in the request, their raw JSON."""

    owner: int
    positions: list[int]
    items: list[bytes]


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
                for upstream in self.upstreams:
                    upstream.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _answer(self, scope: Scope, receive: Receive) -> tuple[int, bytes]:
        route = (scope["method"], scope["path"])
        if route == ("POST", "/score"):
            body = await read_body(scope, receive, self.max_body_bytes)
            card = card_of(scope, body)
            return await self._forward(0 if card is None else self.layout.owner(card), "/score", body)
        if route == ("POST", "/score/batch"):
            return await self._batch(await read_body(scope, receive, self.max_batch_bytes))
        if route == ("GET", "/health"):
            return 200, dumps(await self.health())
        if route == ("GET", "/ready"):
            statuses = await asyncio.gather(*(self._forward(i, "/ready", method="GET")
                                              for i in range(len(self.upstreams))))
            ready = all(status == 200 for status, _ in statuses)
            return (200 if ready else 503), dumps({"ready": ready, "partitions": [s for s, _ in statuses]})
        return 404, dumps({"error": "not_found", "field": None, "detail": f"the router serves POST /score, "
                           f"POST /score/batch, GET /health and GET /ready, not {scope['method']} {scope['path']}"})

    async def _forward(self, index: int, path: str, body: bytes = b"", method: str = "POST") -> tuple[int, bytes]:
        upstream = self.upstreams[index]
        if method == "POST":
            self.routed[index] += 1
        try:
            return await upstream.request(method, path, body)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            return 502, dumps({"error": "upstream_unavailable", "field": None,
                               "detail": f"scoring partition {index} at {upstream.address}: {type(exc).__name__}: {exc}"})

    async def _batch(self, body: bytes) -> tuple[int, bytes]:
        parts = split_batch(body, self.layout)
        if parts is None or len(parts) <= 1:  # refused whole by partition 0, or one owner: as it is
            return await self._forward(parts[0].owner if parts else 0, "/score/batch", body)
        answers = await asyncio.gather(*(self._forward(p.owner, "/score/batch", b'{"transactions":[%s]}'
                                                       % b",".join(p.items)) for p in parts))
        failed = [(p, status, answer) for p, (status, answer) in zip(parts, answers, strict=True) if status != 200]
        if failed:
            return _first_refusal(failed)
        results: list[bytes] = [b""] * sum(len(p.positions) for p in parts)
        for part, (_, answer) in zip(parts, answers, strict=True):
            for position, result in zip(part.positions, msgspec.json.decode(answer, type=_Results).results,
                                        strict=True):
                results[position] = bytes(result)
        return 200, b'{"results":[%s]}' % b",".join(results)

    async def health(self) -> dict[str, Any]:
        answers = await asyncio.gather(*(self._forward(i, "/health", method="GET") for i in range(len(self.upstreams))))
        partitions = []
        for i, (status, body) in enumerate(answers):
            state = json.loads(body).get("status") if status == 200 else "unreachable"
            partitions.append({"index": i, "address": self.upstreams[i].address, "status": state,
                               "routed": self.routed[i]})
        worst = "ok" if all(p["status"] == "ok" for p in partitions) else "degraded"
        return {"status": worst, "partitions": partitions,
                "layout": None if self.layout is None else self.layout.status()}


def _first_refusal(failed: list[tuple[Part, int, bytes]]) -> tuple[int, bytes]:
    """The refusal of the earliest refused item, its ``index`` mapped back to the request's."""
    def original(part: Part, answer: bytes) -> tuple[int, dict[str, Any] | None]:
        try:
            body = json.loads(answer)
        except ValueError:
            return part.positions[0], None
        local = body.get("index") if isinstance(body, dict) else None
        return (part.positions[local] if isinstance(local, int) and 0 <= local < len(part.positions)
                else part.positions[0]), body

    ranked = sorted((original(part, answer) + (status, answer) for part, status, answer in failed),
                    key=lambda r: r[0])
    position, body, status, answer = ranked[0]
    if body is None or "index" not in body:
        return status, answer
    return status, dumps({**body, "index": position})


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
            except (OSError, asyncio.IncompleteReadError, ValueError):
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


def run_router(addresses: list[str], host: str, port: int, max_body_bytes: int, max_batch_bytes: int,
               limit_concurrency: int) -> None:
    """Route until SIGINT/SIGTERM. Raises ServingError when it never started (a partition missing or
    misconfigured: the log says which)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    router = Router([Upstream(a) for a in addresses], max_body_bytes, max_batch_bytes)
    server = uvicorn.Server(router_config(router, host, port, limit_concurrency))
    server.run()
    if not server.started:
        raise ServingError(f"the router did not start on {host}:{port}: see the log above")
