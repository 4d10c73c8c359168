"""Load clients of the serving benchmarks: keep-alive HTTP/1.1 POSTs, sequential, closed-loop or open-loop.

* :func:`closed_loop`: a fixed number of connections, each sending its next request as soon as the
  previous one is answered: latency as the client sees it, throughput at that concurrency.
* :func:`sequential`: one request at a time on one keep-alive connection, over a blocking socket
  (the client's own cost stays a few tens of microseconds): the latency of a lone request.
* :func:`open_loop`: requests sent at a fixed arrival rate whatever the answers do, each on a free
  connection (a new one when all are busy), latency measured from the request's *scheduled* send
  time, so a stalled server is charged for every request that waited behind the stall (no
  coordinated omission). A thread keeps the schedule (``time.sleep`` is precise to ~0.1 ms here; the
  event loop's timers round up to whole milliseconds) and hands each request to the event loop;
  ``late_p99_ms`` is how late the client itself sent them.
* :func:`highest_rate_under`: the highest arrival rate whose p99 stays under a bound (a ladder of
  rates, then bisection between the last that held and the first that did not).

:class:`Connection` is the minimal asyncio client both :func:`closed_loop` and :func:`open_loop` use:
httpx's AsyncClient spends ~0.8 ms of CPU per request here, and on a 2-core machine shared with the
servers the client itself became the bottleneck (a do-nothing FastAPI endpoint: 1.2k requests/s
through httpx, 9.5k through this).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

IDLE_REUSE_S = 2.0  # a connection idle longer is closed, not reused: uvicorn closes idle ones at 5 s
GIVE_UP_BEHIND_S = 2.0  # an open-loop run stops once this many seconds of requests are in flight
SWITCH_INTERVAL_S = 0.0005  # the scheduler thread must get the GIL from the client's loop promptly


class Connection:
    """One keep-alive HTTP/1.1 connection that POSTs JSON and reads the whole response."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.last_used = time.monotonic()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        try:
            self.writer.write(request_bytes(self.host, path, body))
            head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            status = int(head[0].split(" ", 2)[1])
            headers = dict(line.lower().split(": ", 1) for line in head[1:] if ": " in line)
            if "content-length" in headers:
                return status, await self.reader.readexactly(int(headers["content-length"]))
            chunks = []  # chunked transfer encoding
            while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
                chunks.append(await self.reader.readexactly(size + 2))
            await self.reader.readuntil(b"\r\n")
            return status, b"".join(c[:-2] for c in chunks)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            self.close()
            raise
        finally:
            self.last_used = time.monotonic()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def request_bytes(host: str, path: str, body: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (path.encode(), host.encode(), len(body), body))


def cycled(items: Sequence[Any], n: int) -> list[Any]:
    """``n`` items, going round ``items`` as often as needed."""
    return [items[i % len(items)] for i in range(n)]


def fresh_bodies(records: Sequence[dict[str, Any]], n: int, tag: str) -> list[bytes]:
    """``n`` /score bodies going round ``records``, each round's transaction ids made new (``tag``
    names the run), so that every request is a payment the service has not seen: one it holds is
    not added to its history again, which would make repeats cheaper than real traffic."""
    return [json.dumps({**r, "transaction_id": f"{r['transaction_id']}-{tag}-{i // len(records)}"}).encode()
            for i, r in enumerate(cycled(records, n))]


def percentiles_ms(seconds: Sequence[float], *qs: float) -> list[float]:
    ms = np.asarray(seconds) * 1000
    return [round(float(np.percentile(ms, q)), 3) for q in qs]


async def _closed_loop(host: str, port: int, path: str, bodies: Sequence[bytes], concurrency: int,
                       on_progress: Callable[[int], None] | None, more: Callable[[Counter[int]], bool] | None,
                       max_factor: int) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    versions: Counter[int] = Counter()
    explained = 0  # answers with top_features (ours)

    def order() -> Iterator[int]:
        sent = 0
        while sent < len(bodies) or (more is not None and more(versions) and sent < max_factor * len(bodies)):
            yield sent % len(bodies)
            sent += 1

    pending = order()  # one iterator shared by the workers: each body goes to whichever is free

    async def worker() -> None:
        nonlocal errors, explained
        connection = Connection(host, port)
        for i in pending:
            started = time.perf_counter()
            try:
                status, body = await connection.post(path, bodies[i])
            except (OSError, asyncio.IncompleteReadError, ValueError):
                status, body = 0, b""
            latencies.append(time.perf_counter() - started)
            if status != 200:
                errors += 1
            elif body.startswith(b'{"transaction_id"'):  # our /score answer; mlflow serve's are predictions
                answer = json.loads(body)
                versions[answer["model_version"]] += 1
                explained += bool(answer["reasons"]["top_features"])
            if on_progress is not None:
                on_progress(len(latencies))
        connection.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    p50, p99 = percentiles_ms(latencies, 50, 99)
    return {"requests": len(latencies), "p50_ms": p50, "p99_ms": p99, "rps": round(len(latencies) / wall, 1),
            "errors": errors, "versions": dict(versions), "explained": explained}


def closed_loop(host: str, port: int, path: str, bodies: Sequence[bytes], concurrency: int, *,
                on_progress: Callable[[int], None] | None = None,
                more: Callable[[Counter[int]], bool] | None = None, max_factor: int = 1) -> dict[str, Any]:
    """POST every body once, in order, over ``concurrency`` keep-alive connections, each sending the
    next body as soon as its previous answer is in. Returns ``requests``, ``p50_ms``/``p99_ms``
    (latency per request as the client sees it), ``rps``, ``errors`` (non-200 or no answer), and of
    our service's /score answers ``versions`` (requests answered per model version) and ``explained``
    (answers with ``top_features``). ``on_progress(answered so far)`` runs after each answer, on
    the event loop. ``more(versions so far)``: after the last body, start over from the first while
    it says so, at most ``max_factor`` times the bodies in all."""
    return asyncio.run(_closed_loop(host, port, path, bodies, concurrency, on_progress, more, max_factor))


def sequential(host: str, port: int, path: str, bodies: Sequence[bytes]) -> dict[str, Any]:
    """POST every body in turn on one keep-alive connection (blocking socket; responses carry
    Content-Length): ``p50_ms``, ``p99_ms``, ``errors`` (non-200)."""
    latencies, errors = [], 0
    with socket.create_connection((host, port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for body in bodies:
            started = time.perf_counter()
            sock.sendall(request_bytes(host, path, body))
            status = _read_response(sock)
            latencies.append(time.perf_counter() - started)
            errors += status != 200
    p50, p99 = percentiles_ms(latencies, 50, 99)
    return {"requests": len(latencies), "p50_ms": p50, "p99_ms": p99, "errors": errors}


def _read_response(sock: socket.socket) -> int:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length:"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(lines[0].split(" ", 2)[1])


class _OpenLoopRun:
    """The state of one open-loop run (:func:`open_loop`): requests are launched on the event loop
    at their due times by :meth:`schedule`, which runs in its own thread (sleeping there keeps the
    schedule free of the loop's delays); :meth:`send` posts one and records its latency from the
    due time; :meth:`result` summarises."""

    def __init__(self, host: str, port: int, path: str, bodies: Sequence[bytes], rate: float,
                 keep_samples: bool) -> None:
        self.host, self.port, self.path, self.bodies, self.rate = host, port, path, bodies, rate
        self.keep_samples = keep_samples
        self.loop = asyncio.get_running_loop()
        self.free: list[Connection] = []
        self.latencies: list[float] = []
        self.samples: list[tuple[float, float, int]] = []
        self.running: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks
        self.late: list[float] = []
        self.errors = self.opened = self.in_flight = 0
        self.refused: Counter[int] = Counter()  # statuses other than 200 (0: no answer)
        self.stop = threading.Event()
        self.all_sent = asyncio.Event()
        self.finished = asyncio.Event()
        self.first = time.perf_counter() + 0.05

    async def send(self, i: int, due: float) -> None:
        """POST body ``i`` (due at ``due``) on a free connection, or a new one; record the outcome."""
        connection = self.free.pop() if self.free else None
        if connection is not None and time.monotonic() - connection.last_used > IDLE_REUSE_S:
            connection.close()  # the server may be closing it this instant: reconnect (not counted as opened)
        if connection is None:
            connection, self.opened = Connection(self.host, self.port), self.opened + 1
        self.late.append(time.perf_counter() - due)
        try:
            status, _ = await connection.post(self.path, self.bodies[i])
        except (OSError, asyncio.IncompleteReadError, ValueError):
            status = 0
        self.latencies.append(time.perf_counter() - due)
        if self.keep_samples:
            self.samples.append((due - self.first, self.latencies[-1], status))
        self.errors += status != 200
        if status != 200:
            self.refused[status] += 1
        self.free.append(connection)
        self.in_flight -= 1
        if self.all_sent.is_set() and self.in_flight == 0:
            self.finished.set()

    def launch(self, i: int, due: float) -> None:
        """On the event loop: start :meth:`send` of body ``i``; give up when too many are in flight."""
        self.in_flight += 1
        if self.in_flight > self.rate * GIVE_UP_BEHIND_S:
            self.stop.set()  # the server is that far behind: this rate is beyond it
        task = self.loop.create_task(self.send(i, due))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    def schedule(self) -> None:
        """In its own thread: launch each body at ``first + i / rate`` until all are sent or given up."""
        for i in range(len(self.bodies)):
            due = self.first + i / self.rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            if self.stop.is_set():
                break
            self.loop.call_soon_threadsafe(self.launch, i, due)
        self.loop.call_soon_threadsafe(self.all_sent.set)

    def result(self, wall: float) -> dict[str, Any]:
        """The run's figures (:func:`open_loop`), ``wall`` seconds after the first due time."""
        p50, p99, p999 = percentiles_ms(self.latencies, 50, 99, 99.9)
        result = {"rate": self.rate, "requests": len(self.latencies), "p50_ms": p50, "p99_ms": p99,
                  "p99_9_ms": p999, "errors": self.errors,
                  "error_statuses": {str(s): n for s, n in sorted(self.refused.items())},
                  "gave_up": self.stop.is_set(), "achieved_rps": round(len(self.latencies) / wall, 1),
                  "connections": self.opened, "late_p99_ms": percentiles_ms(self.late, 99)[0]}
        return {**result, "samples": self.samples} if self.keep_samples else result


async def _open_loop(host: str, port: int, path: str, bodies: Sequence[bytes], rate: float,
                     keep_samples: bool) -> dict[str, Any]:
    run = _OpenLoopRun(host, port, path, bodies, rate, keep_samples)
    scheduler = threading.Thread(target=run.schedule, name="open-loop-schedule", daemon=True)
    scheduler.start()
    await run.all_sent.wait()
    if run.in_flight:
        await run.finished.wait()
    scheduler.join()
    wall = time.perf_counter() - run.first
    for connection in run.free:
        connection.close()
    return run.result(wall)


def open_loop(host: str, port: int, path: str, bodies: Sequence[bytes], rate: float,
              keep_samples: bool = False) -> dict[str, Any]:
    """Send ``bodies`` at ``rate`` per second (open loop): latency p50/p99/p99.9 from each request's
    scheduled send, ``errors`` (non-200 or failed), ``gave_up`` (more than GIVE_UP_BEHIND_S of
    requests were in flight: the rest were not sent), the connections it needed, and how late the
    client itself sent (``late_p99_ms``). ``keep_samples``: also ``samples``, each request's
    (scheduled send in seconds from the start, latency in seconds, status; 0: no answer)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        return asyncio.run(_open_loop(host, port, path, bodies, rate, keep_samples))
    finally:
        sys.setswitchinterval(previous)


def highest_rate_under(p99_limit_ms: float, measure: Callable[[float], dict[str, Any]], ladder: Sequence[float],
                       bisections: int) -> dict[str, Any]:
    """The highest arrival rate whose open-loop p99 stays under ``p99_limit_ms`` with no error:
    ``measure(rate)`` (:func:`open_loop`'s result) up the ``ladder`` until a rate fails, then
    ``bisections`` halvings between the last rate that held and that one. ``steps``: every run."""
    steps: list[dict[str, Any]] = []

    def holds(rate: float) -> bool:
        result = measure(rate)
        steps.append({k: result[k] for k in ("rate", "requests", "p50_ms", "p99_ms", "errors", "gave_up")})
        return not result["gave_up"] and result["errors"] == 0 and result["p99_ms"] < p99_limit_ms

    best, failed = 0.0, None
    for rate in ladder:
        if not holds(rate):
            failed = rate
            break
        best = rate
    for _ in range(bisections if failed is not None else 0):
        middle = round((best + failed) / 2)
        if middle in (best, failed):
            break
        if holds(middle):
            best = middle
        else:
            failed = middle
    return {"highest_rate": best, "first_failing_rate": failed, "p99_limit_ms": p99_limit_ms, "steps": steps}
