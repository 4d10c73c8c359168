"""The router's client for one scoring partition: pooled keep-alive HTTP/1.1, every call under a deadline.

Guarantees of :meth:`Upstream.request`:

* it returns or raises within ``timeout_s`` (:class:`UpstreamTimeout` past it): aiohttp's
  ``ClientTimeout.total`` bounds the whole call, waiting for a pooled connection, connecting,
  writing and reading included, so a stalled partition (SIGSTOPped, swapping, a GC pause) costs its
  callers ``timeout_s``, never forever;
* a partition that cannot be reached, or drops the connection, is :class:`UpstreamUnavailable`;
* a POST is never retried (aiohttp retries a dropped keep-alive connection only for idempotent
  methods): a ``/score`` that reached a partition was published to the scores topic, and a retry
  would publish it twice. After a timeout the partition may still answer, and so score, later.
* a pooled connection idle for more than ``IDLE_S`` is closed rather than reused, so a request is
  never written to a connection uvicorn (5 s keep-alive) may be closing.

Why aiohttp, not httpx (the test client here): one POST to a do-nothing uvicorn on this 2-core
machine costs the caller ~0.9 ms of CPU through ``httpx.AsyncClient`` (h11 in pure Python, then
anyio), ~0.5 ms through httpcore's pool alone and ~0.1-0.16 ms through aiohttp (llhttp, in C),
where the hand-written client this replaced took ~0.03-0.05 ms and had no deadline at all. On the
router's hop, in front of partitions that answer in about a millisecond, httpx would be the tier's
bottleneck. The session is made on first use, inside the loop that will run it (aiohttp binds it).
"""

from __future__ import annotations

from typing import Any

import aiohttp

IDLE_S = 2.0  # a pooled connection idle longer is closed, not reused (uvicorn keeps 5 s)
DEFAULT_TIMEOUT_S = 5.0  # serving.toml [router] upstream_timeout_s
DEFAULT_MAX_CONNECTIONS = 512  # the router's own limit_concurrency: no call waits for a pooled connection
JSON_CONTENT = {"content-type": "application/json"}


class UpstreamFailed(Exception):
    """A partition did not answer a call: the router answers ``status`` with :meth:`body`, which
    names the partition (``partition.index``, ``partition.address``)."""

    status = 502
    reason = "upstream_unavailable"

    def __init__(self, upstream: Upstream, method: str, path: str, detail: str) -> None:
        super().__init__(f"scoring partition {upstream.index} at {upstream.address}, {method} {path}: {detail}")
        self.index, self.address, self.method = upstream.index, upstream.address, method

    def body(self) -> dict[str, Any]:
        return {"error": self.reason, "field": None, "detail": str(self),
                "partition": {"index": self.index, "address": self.address}}


class UpstreamUnavailable(UpstreamFailed):
    """Refused, reset or closed before it answered (502)."""


class UpstreamTimeout(UpstreamFailed):
    """No whole answer within the deadline (504). A POST's outcome is unknown: the partition may
    still score it when it recovers."""

    status = 504
    reason = "upstream_timeout"


class Upstream:
    """Pooled keep-alive HTTP/1.1 to scoring partition ``index`` at ``address`` (``host:port``)."""

    def __init__(self, index: int, address: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        self.index, self.address, self.timeout_s = index, address, timeout_s
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """Status and body of one call; :class:`UpstreamTimeout` or :class:`UpstreamUnavailable`."""
        try:
            async with self._client().request(method, path, data=body or None, headers=JSON_CONTENT) as response:
                return response.status, await response.read()
        except TimeoutError as exc:  # the total deadline, and aiohttp's own ServerTimeoutError
            what = (" A payment sent in it may still be scored and published when the partition recovers: "
                    "look for its transaction_id on the scores topic before sending it again."
                    if method == "POST" else "")
            raise UpstreamTimeout(self, method, path, f"no answer within {self.timeout_s:g} s "
                                  f"(serving.toml [router] upstream_timeout_s): it is stalled or overloaded, "
                                  f"see its /health and log.{what}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamUnavailable(self, method, path, f"{type(exc).__name__}: {exc or 'connection failed'}; "
                                      "is it running? (fraudctl serve --partition ...)") from exc

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.max_connections, keepalive_timeout=IDLE_S)
            self._session = aiohttp.ClientSession(
                f"http://{self.address}", connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                auto_decompress=False, skip_auto_headers=("User-Agent", "Accept-Encoding"))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
