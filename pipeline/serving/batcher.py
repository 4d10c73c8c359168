"""Concurrent POST /score requests scored together, one batch at a time; a lone one on the event loop.

A request puts its event in the pending list and awaits its own result. When nothing is being
scored, the pending events are dispatched at the end of the current turn of the event loop (so
requests that arrived together are scored together): a lone event is scored right there, on the
event loop, and a batch of several goes to the scoring thread. While a batch is in the thread,
requests keep gathering and go as the next batch the moment it is done. Under light load a batch is
one request; under load, batches grow to what arrived during one batch, at most ``max_batch``.
Batching is what keeps the cost per request down: much of a one-payment call of the feature kernel
or of the model is per-call overhead (numpy's and torch's per-operation costs), paid once per batch.

Why a lone event is not handed to the thread: the hand-off is two thread wake-ups (the scoring
thread's, then the event loop's through its self-pipe), each waiting for the OS to schedule the
thread and for the GIL, ~80 us at the median and several times that in the tail on a 2-core machine,
for nothing: an idle event loop has nothing to do in parallel with a lone payment. A batch of several
goes to the thread, so that under load the event loop reads, validates and answers requests while the
thread scores (the model's kernels run without the GIL, so the two threads share both cores).

Batches never overlap (inline or in the thread): each sees every earlier batch's payments in the
online features. A batch that raises is scored again one event at a time, so one request's failure
(or NotReady) is that request's alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily

MAX_BATCH = 64  # events per batch: bounds one forward (64 * 31 rows, tens of ms here); a burst waits a turn


class ScoreBatcher:
    """``await batcher.score(event)`` -> ``score_batch([... event ...])``'s result for that event."""

    def __init__(self, score_batch: Callable[[Sequence[dict[str, Any]]], list[Any]],
                 max_batch: int = MAX_BATCH) -> None:
        self._score_batch = score_batch
        self.max_batch = max_batch
        self._pending: list[tuple[dict[str, Any], asyncio.Future[Any]]] = []
        self._busy = False  # a batch is being scored, or is about to be dispatched
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="scoring")
        self.batches = 0
        self.events = 0
        self.inline = 0  # batches of one scored on the event loop

    async def score(self, event: dict[str, Any]) -> Any:
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Any] = loop.create_future()
        self._pending.append((event, result))
        if not self._busy:
            self._busy = True
            loop.call_soon(self._dispatch, loop)  # after the requests that arrived in this turn joined
        return await result

    def families(self) -> list[CounterMetricFamily]:
        """For /metrics: batches scored and the requests in them (their ratio is the mean batch size)."""
        return [CounterMetricFamily("fraud_scoring_batches_total", "Batches of POST /score requests scored together.",
                                    value=self.batches),
                CounterMetricFamily("fraud_scoring_batched_requests_total", "POST /score requests in those batches.",
                                    value=self.events),
                CounterMetricFamily("fraud_scoring_inline_batches_total", "Of those batches, lone requests scored on "
                                    "the event loop (nothing else pending, the scoring thread idle).", value=self.inline)]

    def close(self) -> None:
        """Stop the scoring thread once the batch in progress is done."""
        self._executor.shutdown(wait=True)

    def _dispatch(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = [(event, result) for event, result in self._pending[: self.max_batch] if not result.done()]
        del self._pending[: self.max_batch]
        if not batch:
            self._busy = bool(self._pending)
            if self._busy:
                loop.call_soon(self._dispatch, loop)
            return
        self.batches += 1
        self.events += len(batch)
        events = [event for event, _ in batch]
        if len(batch) == 1:
            self.inline += 1
            try:
                outcomes = self._score(events)
            except Exception as exc:  # handed to the request's handler, as from the thread
                outcomes = [exc]
            self._settle(loop, batch, outcomes)
            return
        done = self._executor.submit(self._score, events)
        done.add_done_callback(lambda f: loop.is_closed() or loop.call_soon_threadsafe(self._finish, loop, batch, f))

    def _score(self, events: list[dict[str, Any]]) -> list[Any]:
        """The batch's results, or each event's own result or exception (a lone event's raises)."""
        try:
            return list(self._score_batch(events))
        except Exception:
            if len(events) == 1:
                raise
        outcomes: list[Any] = []
        for event in events:
            try:
                outcomes.append(self._score_batch([event])[0])
            except Exception as exc:  # handed to that request's handler
                outcomes.append(exc)
        return outcomes

    def _finish(self, loop: asyncio.AbstractEventLoop, batch: list[tuple[dict[str, Any], asyncio.Future[Any]]],
                done: Future[list[Any]]) -> None:
        error = RuntimeError("the scoring thread stopped") if done.cancelled() else done.exception()
        self._settle(loop, batch, [error] * len(batch) if error is not None else done.result())

    def _settle(self, loop: asyncio.AbstractEventLoop, batch: list[tuple[dict[str, Any], asyncio.Future[Any]]],
                outcomes: Sequence[Any]) -> None:
        """Each request gets its outcome; then the next batch goes, or the batcher is idle."""
        for (_, result), outcome in zip(batch, outcomes, strict=True):
            if result.done():  # the request was cancelled (client gone)
                continue
            if isinstance(outcome, BaseException):
                result.set_exception(outcome)
            else:
                result.set_result(outcome)
        if self._pending:
            self._dispatch(loop)
        else:
            self._busy = False
