"""The request batcher: requests of one loop turn go together, later ones wait for the next batch,
a lone request is scored on the event loop and a batch of several in the scoring thread, a failing
event fails alone, batches never overlap."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pipeline.serving.batcher import ScoreBatcher
from pipeline.serving.errors import NotReady


class Recorder:
    """A score_batch that records each batch, can be held inside a batch, and refuses 'bad' events."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.threads: list[int] = []  # the thread that scored each batch
        self.inside = threading.Event()  # a batch is being scored
        self.release = threading.Event()
        self.release.set()
        self.overlaps = 0
        self._running = threading.Lock()

    def __call__(self, events: list[dict]) -> list[int]:
        if not self._running.acquire(blocking=False):
            self.overlaps += 1
            self._running.acquire()
        try:
            self.batches.append([e["n"] for e in events])
            self.threads.append(threading.get_ident())
            self.inside.set()
            self.release.wait(10)
            if any(e.get("bad") for e in events):
                raise ValueError("bad event")
            return [e["n"] * 10 for e in events]
        finally:
            self._running.release()


def run(coro):
    return asyncio.run(coro)


def test_requests_of_one_turn_are_scored_as_one_batch():
    recorder = Recorder()
    batcher = ScoreBatcher(recorder)

    async def main():
        return await asyncio.gather(*(batcher.score({"n": n}) for n in range(5)))

    try:
        assert run(main()) == [0, 10, 20, 30, 40]
    finally:
        batcher.close()
    assert recorder.batches == [[0, 1, 2, 3, 4]]


def test_requests_arriving_during_a_batch_form_the_next_one_and_batches_never_overlap():
    recorder = Recorder()
    batcher = ScoreBatcher(recorder, max_batch=3)

    async def main():
        recorder.release.clear()
        first = asyncio.gather(batcher.score({"n": 0}), batcher.score({"n": 1}))  # a batch of two: the thread
        while not recorder.inside.is_set():  # batch [0, 1] is being scored
            await asyncio.sleep(0.001)
        later = [asyncio.ensure_future(batcher.score({"n": n})) for n in range(2, 7)]
        await asyncio.sleep(0.01)
        recorder.release.set()
        return await first, await asyncio.gather(*later)

    try:
        first, later = run(main())
    finally:
        batcher.close()
    assert (first, later) == ([0, 10], [20, 30, 40, 50, 60])
    assert recorder.batches == [[0, 1], [2, 3, 4], [5, 6]]  # what waited, at most max_batch at a time
    assert recorder.overlaps == 0


def test_a_lone_request_is_scored_on_the_event_loop_and_a_batch_in_the_scoring_thread():
    recorder = Recorder()
    batcher = ScoreBatcher(recorder)

    async def main():
        loop_thread = threading.get_ident()
        alone = await batcher.score({"n": 1})
        together = await asyncio.gather(*(batcher.score({"n": n}) for n in (2, 3, 4)))
        after = await batcher.score({"n": 5})  # idle again: the event loop
        return loop_thread, alone, together, after

    try:
        loop_thread, alone, together, after = run(main())
    finally:
        batcher.close()
    assert (alone, together, after) == (10, [20, 30, 40], 50)
    assert recorder.batches == [[1], [2, 3, 4], [5]]
    assert [t == loop_thread for t in recorder.threads] == [True, False, True]
    assert (batcher.batches, batcher.events, batcher.inline) == (3, 5, 2)


def test_a_lone_request_arriving_while_the_thread_scores_waits_for_the_next_batch():
    recorder = Recorder()
    batcher = ScoreBatcher(recorder)

    async def main():
        recorder.release.clear()
        first = asyncio.gather(batcher.score({"n": 0}), batcher.score({"n": 1}))
        while not recorder.inside.is_set():
            await asyncio.sleep(0.001)
        lone = asyncio.ensure_future(batcher.score({"n": 2}))  # the thread is busy: not inline
        await asyncio.sleep(0.01)
        assert not lone.done()
        recorder.release.set()
        return await first, await lone

    try:
        assert run(main()) == ([0, 10], 20)
    finally:
        batcher.close()
    assert recorder.batches == [[0, 1], [2]] and recorder.overlaps == 0


def test_a_failing_event_fails_alone():
    recorder = Recorder()
    batcher = ScoreBatcher(recorder)

    async def main():
        return await asyncio.gather(batcher.score({"n": 1}), batcher.score({"n": 2, "bad": True}),
                                    batcher.score({"n": 3}), return_exceptions=True)

    try:
        ok1, bad, ok3 = run(main())
    finally:
        batcher.close()
    assert (ok1, ok3) == (10, 30) and isinstance(bad, ValueError)
    assert recorder.batches == [[1, 2, 3], [1], [2], [3]]  # the batch, then one at a time


def test_a_lone_failing_request_gets_its_error_and_the_next_one_is_scored():
    recorder = Recorder()
    batcher = ScoreBatcher(recorder)

    async def main():
        bad = await asyncio.gather(batcher.score({"n": 1, "bad": True}), return_exceptions=True)
        return bad[0], await batcher.score({"n": 2})

    try:
        bad, ok = run(main())
    finally:
        batcher.close()
    assert isinstance(bad, ValueError) and ok == 20
    assert recorder.batches == [[1], [2]]


def test_not_ready_reaches_every_request():
    def not_ready(events):
        raise NotReady("no model is loaded yet")

    batcher = ScoreBatcher(not_ready)

    async def main():
        return await asyncio.gather(*(batcher.score({"n": n}) for n in range(3)), return_exceptions=True)

    try:
        outcomes = run(main())
    finally:
        batcher.close()
    assert all(isinstance(o, NotReady) for o in outcomes)


@pytest.mark.parametrize("n", [1, 200])
def test_every_request_gets_its_own_result(n):
    batcher = ScoreBatcher(lambda events: [e["n"] for e in events], max_batch=16)

    async def main():
        return await asyncio.gather(*(batcher.score({"n": i}) for i in range(n)))

    try:
        assert run(main()) == list(range(n))
    finally:
        batcher.close()
    assert batcher.events == n and batcher.batches == -(-n // 16)
