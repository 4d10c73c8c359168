"""Whether the event feed keeps up with its topics: positions outside their partition, and stalls.

The feed (:mod:`.stream`) reads each partition from a position of its own: the raw store's committed
offset at start, then wherever it got to. Nothing tells a consumer that its position stopped making
sense. After a broker restart that recreated the topics, a position of 56760 on a partition that now
ends at 1583 fetches nothing, without an error, for ever (the embedded broker answers such a fetch
empty; Kafka answers OFFSET_OUT_OF_RANGE, which the feed turns into a paused partition). So a probe
(:meth:`.stream.EventFeed.check_offsets`, every ``stream.watch_interval_s``) reads every partition's
earliest and end offsets and :class:`StreamWatch` judges the feed's positions against them:

* **out of range**: a position before the partition's earliest retained offset (retention deleted
  records the feed never read) or beyond its end (the topic was recreated). The definition and the
  words are ingest's (:func:`pipeline.ingest.offsets.plan_offset_ranges`, whose OffsetGapError the
  same raw-store offsets raise in the ingest job), so /health, /metrics and ingest say the same
  thing, ingest's remedy included. ``stream.on_offset_gap`` decides what the feed does about it
  (:func:`describe_gap`).
* **stalled**: a position that has not moved for ``stream.stall_after_s`` while the partition's end
  grew past it (consumer lag growing): a stuck feed thread, or fetches that never return records.

Guarantees: positions are sampled before the offsets are read, so a healthy feed's position is never
judged beyond an end read after it. A judgement holds only while the feed's live position is the one
judged: any progress ends it at once, and the next probe judges the partition again.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pipeline.ingest.offsets import OffsetGapError, plan_offset_ranges
from pipeline.serving.config import OffsetGapPolicy

Key = tuple[str, int]  # (topic, partition); kafka-python's TopicPartition is such a tuple
MAX_RESETS_KEPT = 100  # /health lists the latest resets; /metrics counts all of them


def partition_name(key: Key) -> str:
    return f"{key[0]}[{key[1]}]"


@dataclass(frozen=True)
class OffsetGap:
    """``position`` is outside ``[low, high]`` of its partition (``high``: one past the last record).
    ``detail`` is ingest's OffsetGapError message for the same offsets: the problem and its remedy."""

    topic: str
    partition: int
    position: int
    low: int
    high: int
    detail: str


def find_offset_gap(key: Key, position: int, low: int, high: int) -> OffsetGap | None:
    """The gap if ``position`` lies outside ``[low, high]``, else None (``position == high`` is caught up).

    Judged by ingest's planner, so the service and the ingest job never disagree about a gap."""
    topic, partition = key
    try:
        plan_offset_ranges(topic, {partition: position}, {partition: (low, high)})
    except OffsetGapError as exc:
        return OffsetGap(topic, partition, position, low, high, str(exc))
    return None


def describe_gap(gap: OffsetGap, policy: OffsetGapPolicy) -> str:
    """The /health reason for ``gap``: ingest's words, then what the feed does under ``policy``."""
    name = partition_name((gap.topic, gap.partition))
    if policy == "earliest":
        action = f'resumes {name} from offset {gap.low} (stream.on_offset_gap = "earliest")'
    elif gap.position > gap.high:
        action = (f'waits until {name} reaches offset {gap.position} (stream.on_offset_gap = "wait"; '
                  f'"earliest" resumes it from offset {gap.low})')
    else:  # the records it waits for are gone: only an operator ends this wait
        action = (f'waits (stream.on_offset_gap = "wait"), but {name} will not return to offset {gap.position}: '
                  f'set "earliest" to resume from offset {gap.low}')
    return f"event feed: {gap.detail}. The feed {action}."


@dataclass(frozen=True)
class Stall:
    """A position that has not moved for ``stalled_s`` seconds while the end grew from ``high_before``."""

    topic: str
    partition: int
    position: int
    high: int
    high_before: int
    stalled_s: float

    @property
    def lag(self) -> int:
        return self.high - self.position

    def reason(self) -> str:
        return (f"event feed: {partition_name((self.topic, self.partition))} has stayed at offset {self.position} "
                f"for {self.stalled_s:.0f}s while its end grew from {self.high_before} to {self.high} "
                f"(lag {self.lag}); see stream.last_error and the service log")


@dataclass(frozen=True)
class OffsetReset:
    """The feed moved a partition from ``from_offset`` to ``to_offset`` (policy ``earliest``). ``skipped``
    records are known lost: those retention deleted unread; 0 for a recreated topic, whose old records
    after ``from_offset`` can no longer be counted. ``at``: Unix time."""

    topic: str
    partition: int
    from_offset: int
    to_offset: int
    skipped: int
    at: float
    detail: str


@dataclass
class _Progress:
    """A partition as of the last probe. ``since``: when its position last moved or it was last caught
    up (the stall clock); ``high_since``: its end then."""

    position: int
    low: int
    high: int
    since: float
    high_since: int


@dataclass(frozen=True)
class WatchReport:
    """What holds now, for the feed's live positions (see :meth:`StreamWatch.report`)."""

    offsets: dict[Key, tuple[int, int, int]]  # (live position, earliest, end as last probed)
    gaps: list[OffsetGap]
    stalls: list[Stall]
    resets: list[OffsetReset]  # the latest MAX_RESETS_KEPT, oldest first
    resets_total: dict[Key, int]
    skipped_total: dict[Key, int]
    checked_at: float | None  # Unix time of the last successful probe
    error: str | None  # why the last probe failed (None: it did not)


class StreamWatch:
    """Judges probes of the feed's partitions; thread-safe (the probe, the feed and /health call it).

    ``clock`` (seconds, monotonic) times stalls; ``stall_after_s`` is how long a position may stay
    put while its partition's end grows."""

    def __init__(self, stall_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_after_s = stall_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._progress: dict[Key, _Progress] = {}
        self._gaps: dict[Key, OffsetGap] = {}
        self._resets: deque[OffsetReset] = deque(maxlen=MAX_RESETS_KEPT)
        self._resets_total: Counter[Key] = Counter()
        self._skipped_total: Counter[Key] = Counter()
        self._checked_at: float | None = None
        self._error: str | None = None
        self.probes = 0  # successful probes so far: lets the feed wait for a judgement made after an event

    def observe(self, positions: Mapping[Key, int], offsets: Mapping[Key, tuple[int, int]]) -> list[OffsetGap]:
        """Judge one probe: ``positions`` (the feed's, sampled first) against ``offsets`` (``(earliest,
        end)`` per partition, read after them). A partition missing from either is not judged.
        Returns the gaps found; they replace the previous probe's."""
        now = self._clock()
        gaps = {}
        with self._lock:
            for key, position in positions.items():
                if key not in offsets:
                    continue
                low, high = offsets[key]
                gap = find_offset_gap(key, position, low, high)
                if gap is not None:
                    gaps[key] = gap
                self._track(key, position, low, high, now)
            self._gaps = gaps
            self._checked_at, self._error = time.time(), None
            self.probes += 1
        return list(gaps.values())

    def _track(self, key: Key, position: int, low: int, high: int, now: float) -> None:
        last = self._progress.get(key)
        if last is None or position != last.position or high <= position:  # moved, or nothing to read
            self._progress[key] = _Progress(position, low, high, now, high)
        else:
            last.low, last.high = low, high

    def probe_failed(self, error: str) -> None:
        """Record why a probe could not read the offsets; the last judgements stand."""
        with self._lock:
            self._error = error

    def has_gap(self, key: Key) -> bool:
        """Whether the last probe found ``key`` out of range."""
        return key in self._gaps

    def record_reset(self, gap: OffsetGap, to_offset: int) -> OffsetReset:
        """Record that the feed moved ``gap``'s partition to ``to_offset``."""
        key = (gap.topic, gap.partition)
        reset = OffsetReset(gap.topic, gap.partition, gap.position, to_offset, max(0, to_offset - gap.position),
                            time.time(), gap.detail)
        with self._lock:
            self._resets.append(reset)
            self._resets_total[key] += 1
            self._skipped_total[key] += reset.skipped
            self._gaps.pop(key, None)
        return reset

    def report(self, positions: Mapping[Key, int]) -> WatchReport:
        """Gaps and stalls that still hold for the feed's live ``positions``: a partition whose position
        moved since the probe has neither (until the next probe judges it)."""
        now = self._clock()
        with self._lock:
            gaps = [g for key, g in self._gaps.items() if positions.get(key) == g.position]
            stalls = [Stall(key[0], key[1], p.position, p.high, p.high_since, now - p.since)
                      for key, p in self._progress.items()
                      if positions.get(key) == p.position and key not in self._gaps
                      and p.high > max(p.position, p.high_since) and now - p.since >= self.stall_after_s]
            offsets = {key: (positions.get(key, p.position), p.low, p.high) for key, p in self._progress.items()}
            return WatchReport(offsets, gaps, stalls, list(self._resets), dict(self._resets_total),
                               dict(self._skipped_total), self._checked_at, self._error)
