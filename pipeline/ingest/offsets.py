"""Kafka offsets of the raw store: what was consumed, and what the next run reads.

Committed offsets live with the raw store (``<raw>/_state/offsets.json``), not in a consumer
group: the raw store and its offsets must move together, and a group's offsets would advance
without the store. :class:`OffsetStore` replaces the file atomically (write temp, fsync,
``os.replace``) and only after the run's raw files are written, so a killed run leaves the last
commit intact and the next run re-reads exactly the uncommitted range.

The file also lists the committed run ids: raw files of any other run are invisible to readers
(see :mod:`pipeline.ingest.raw_layout`), and the live identity-index segments with their format
(``index_format``): an index of another format (or none marked, format 1) loads as no index, so the
store gets one built from its committed files (:mod:`pipeline.ingest.index_build`) and its old
segments, then unlisted, are deleted (``RawStore.discard_uncommitted``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.atomic import write_json_atomic
from pipeline.ingest.id_index import INDEX_FORMAT


class OffsetGapError(RuntimeError):
    """Records between the committed offset and the earliest retained one are gone."""


@dataclass(frozen=True)
class OffsetRange:
    """Records ``[start, end)`` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class OffsetPlan:
    """What one run reads from one topic: a range per partition (possibly empty) and any loss."""

    topic: str
    ranges: tuple[OffsetRange, ...]
    lost: dict[int, int] = field(default_factory=dict)  # partition -> records skipped (allow_data_loss)

    @property
    def records(self) -> int:
        return sum(r.count for r in self.ranges)

    def next_offsets(self) -> dict[int, int]:
        """Offsets to commit once this plan's records are stored."""
        return {r.partition: r.end for r in self.ranges}


def plan_offset_ranges(topic: str, committed: dict[int, int], watermarks: dict[int, tuple[int, int]],
                       allow_data_loss: bool = False) -> OffsetPlan:
    """Plan ``[start, end)`` per partition from committed offsets and ``(low, high)`` watermarks.

    ``watermarks`` must come from :func:`pipeline.kafka.admin.end_offsets` (the high watermark is
    taken once, here, so records produced while the run reads wait for the next run). A partition
    never committed starts at its low watermark. A committed offset below ``low`` (retention
    deleted unread records) or above ``high`` (topic recreated) raises :class:`OffsetGapError`
    unless ``allow_data_loss``, which restarts at ``low`` and reports the skipped count.
    """
    missing = sorted(set(committed) - set(watermarks))
    if missing and not allow_data_loss:
        raise OffsetGapError(f"topic {topic!r} no longer has partitions {missing} that the raw store consumed; "
                             f"the topic was recreated? rerun with --allow-data-loss to continue from what exists")
    ranges, lost = [], {}
    for p, (low, high) in sorted(watermarks.items()):
        start = committed.get(p, low)
        if start < low or start > high:
            problem = (f"records {start}..{low - 1} were deleted by retention before they were ingested"
                       if start < low else
                       f"the committed offset {start} is beyond the end {high} (topic recreated or another cluster?)")
            if not allow_data_loss:
                raise OffsetGapError(f"{topic}[{p}]: {problem}; rerun with --allow-data-loss to skip them "
                                     f"(the loss is recorded in the run manifest)")
            lost[p] = max(0, low - start)
            start = low
        ranges.append(OffsetRange(topic, p, start, high))
    return OffsetPlan(topic, tuple(ranges), lost)


@dataclass(frozen=True)
class StoreCommit:
    """The raw store's committed state: next offset per topic partition, committed runs."""

    offsets: dict[str, dict[int, int]]
    first_offsets: dict[str, dict[int, int]]  # where consumption began: the manifest's [start, end)
    runs: tuple[str, ...]
    watermarks: dict[str, dict[int, int]] = field(default_factory=dict)  # latest accepted event time (us)
    # Live identity-index segments per raw table (see pipeline.ingest.id_index); None: a store
    # committed before the index existed, or with an index of another format, whose index is built
    # on first use.
    index: dict[str, list[str]] | None = None

    def consumed_ranges(self) -> dict[str, dict[str, list[int]]]:
        """``{topic: {partition: [first, next)}}`` as the dataset manifest records it."""
        return {t: {str(p): [self.first_offsets.get(t, {}).get(p, n), n] for p, n in sorted(parts.items())}
                for t, parts in sorted(self.offsets.items())}


class OffsetStore:
    """Committed offsets and runs of one raw store, in ``<root>/_state/offsets.json``."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / "_state" / "offsets.json"

    def load(self) -> StoreCommit:
        if not self.path.is_file():
            return StoreCommit({}, {}, ())
        d = json.loads(self.path.read_text())
        index = d.get("index") if d.get("index_format", 1) == INDEX_FORMAT else None
        return StoreCommit(_from_json(d["offsets"]), _from_json(d["first_offsets"]), tuple(d["runs"]),
                           _from_json(d.get("watermarks", {})), index)

    def commit(self, run_id: str, plans: list[OffsetPlan], watermarks: dict[str, dict[int, int]] | None = None,
               index: dict[str, list[str]] | None = None) -> StoreCommit:
        """Record ``run_id`` as committed, advance offsets to the end of ``plans``, raise the
        partitions' watermarks to ``watermarks`` (never lowers them) and make ``index`` the live
        identity-index segments (kept as they were when None). One atomic file replace."""
        current = self.load()
        offsets = {t: dict(p) for t, p in current.offsets.items()}
        first = {t: dict(p) for t, p in current.first_offsets.items()}
        marks = {t: dict(p) for t, p in current.watermarks.items()}
        for plan in plans:
            offsets.setdefault(plan.topic, {}).update(plan.next_offsets())
            for r in plan.ranges:
                first.setdefault(plan.topic, {}).setdefault(r.partition, r.start)
        for topic, parts in (watermarks or {}).items():
            for p, w in parts.items():
                marks.setdefault(topic, {})[p] = max(w, marks.get(topic, {}).get(p, w))
        live_index = index if index is not None else current.index
        return self._write(StoreCommit(offsets, first, current.runs + (run_id,), marks, live_index))

    def set_index(self, index: dict[str, list[str]]) -> StoreCommit:
        """Record ``index`` as the live identity-index segments without committing a run (the
        index built for a store that predates it; see pipeline.ingest.index_build)."""
        current = self.load()
        return self._write(StoreCommit(current.offsets, current.first_offsets, current.runs, current.watermarks,
                                       index))

    def _write(self, new: StoreCommit) -> StoreCommit:
        write_json_atomic(self.path, {"offsets": _to_json(new.offsets), "first_offsets": _to_json(new.first_offsets),
                                       "watermarks": _to_json(new.watermarks), "runs": list(new.runs),
                                       **({"index": new.index, "index_format": INDEX_FORMAT}
                                          if new.index is not None else {})})
        return new


def _to_json(m: dict[str, dict[int, int]]) -> dict:
    return {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(m.items())}


def _from_json(m: dict) -> dict[str, dict[int, int]]:
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in m.items()}
