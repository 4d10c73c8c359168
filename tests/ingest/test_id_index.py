"""The identity index: look-ups find exactly what was committed (all 128 bits of it), merges keep
every entry, a segment the commit log does not list is invisible and cleaned up, and a bucket of
the old 64-bit format is refused, never misread."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.ingest.id_index import Entries, IdIndex, IndexFormatError, counter_layout, segment_span
from pipeline.ingest.identity import IDENTITY


def identities(h1, h2=None) -> np.ndarray:
    """128-bit identities from their halves (``h2`` defaults to a function of ``h1``)."""
    h1 = np.asarray(h1, np.uint64)
    out = np.empty(len(h1), IDENTITY)
    out["h1"], out["h2"] = h1, (h1 * np.uint64(7) + np.uint64(1)) if h2 is None else np.asarray(h2, np.uint64)
    return out


def entries(ids, run: int, day: int = 20_000) -> Entries:
    ids = ids if isinstance(ids, np.ndarray) and ids.dtype == IDENTITY else identities(ids)
    return Entries(ids, ids["h1"] * np.uint64(3), np.full(len(ids), day, np.int32), np.full(len(ids), run, np.int32))


def spread(n: int, seed: int) -> np.ndarray:
    """Identities over the whole 128-bit range (every bucket)."""
    rng = np.random.default_rng(seed)
    return identities(*(rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True) for _ in range(2)))


def test_lookup_finds_stored_hashes_with_their_entry_and_nothing_else(tmp_path):
    stored = spread(5_000, 1)
    index = IdIndex(tmp_path, IdIndex(tmp_path, []).with_run(0, entries(stored, run=0, day=20_111)))
    wanted = np.concatenate([stored[::7], spread(1_000, 2), stored[:3]])
    m = index.lookup(wanted)
    n_stored = len(stored[::7])
    assert m.found[:n_stored].all() and not m.found[n_stored:n_stored + 1_000].any() and m.found[-3:].all()
    assert (m.contents[m.found] == wanted["h1"][m.found] * np.uint64(3)).all()
    assert set(m.days[m.found].tolist()) == {20_111} and set(m.runs[m.found].tolist()) == {0}


def test_negative_days_and_large_run_ordinals_round_trip(tmp_path):
    e = Entries(identities([5, 2**63 + 5]), np.array([1, 2], np.uint64),
                np.array([-3, 40_000], np.int32), np.array([0, 2**31 - 1], np.int32))
    m = IdIndex(tmp_path, IdIndex(tmp_path, []).with_segment("000000-000000", e)).lookup(e.ids)
    assert m.days.tolist() == [-3, 40_000] and m.runs.tolist() == [0, 2**31 - 1]


def test_segments_merge_like_a_binary_counter_and_keep_every_entry(tmp_path):
    live: list[str] = []
    all_ids = []
    for run in range(11):
        ids = spread(300, 100 + run)
        all_ids.append(ids)
        live = IdIndex(tmp_path, live).with_run(run, entries(ids, run))
        IdIndex(tmp_path, live).discard_unlisted()
    spans = [segment_span(s) for s in live]
    # 11 = 8 + 2 + 1 runs: three segments, oldest first, covering every run once.
    assert [b - a + 1 for a, b in spans] == [8, 2, 1]
    assert live == counter_layout(11)
    assert sorted(r for a, b in spans for r in range(a, b + 1)) == list(range(11))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(live)
    m = IdIndex(tmp_path, live).lookup(np.concatenate(all_ids))
    assert m.found.all()
    assert m.runs.tolist() == [run for run, ids in enumerate(all_ids) for _ in ids]


def test_a_run_that_kept_nothing_adds_no_segment(tmp_path):
    live = IdIndex(tmp_path, []).with_run(0, entries([1, 2], 0))
    assert IdIndex(tmp_path, live).with_run(1, Entries.empty()) == live


def test_unlisted_segments_are_invisible_and_discarded(tmp_path):
    committed = IdIndex(tmp_path, []).with_run(0, entries([10, 11], 0))
    # A run killed after writing (and merging) its segment, before its commit:
    uncommitted = IdIndex(tmp_path, committed).with_run(1, entries([12], 1))
    assert uncommitted == ["000000-000001"]  # its own segment merged with the committed one
    on_disk = {p.name for p in tmp_path.iterdir()}
    index = IdIndex(tmp_path, committed)
    assert index.lookup(identities([10, 12])).found.tolist() == [True, False]
    removed = index.discard_unlisted()
    assert {p.name for p in removed} == on_disk - set(committed) == {"000000-000001", "000001-000001"}
    assert sorted(p.name for p in tmp_path.iterdir()) == committed
    assert index.lookup(identities([10, 11])).found.all()


def test_an_empty_index_finds_nothing(tmp_path):
    assert not IdIndex(tmp_path / "none", []).lookup(identities([1, 2])).found.any()


def test_identities_sharing_their_first_64_bits_are_told_apart(tmp_path):
    # A 64-bit collision: three stored events with one h1 (side by side in their bucket, in one
    # segment and across two), and a new event with that h1 too. Only full 128-bit matches count.
    shared = 0xB000_0000_0000_0001
    first = entries(identities([shared, shared, 5], [30, 10, 1]), run=0, day=20_001)
    second = entries(identities([shared], [20]), run=1, day=20_002)
    live = IdIndex(tmp_path, []).with_segment("000000-000000", first)
    index = IdIndex(tmp_path, IdIndex(tmp_path, live).with_segment("000001-000001", second))
    m = index.lookup(identities([shared, shared, shared, shared, 5], [10, 20, 30, 40, 1]))
    assert m.found.tolist() == [True, True, True, False, True]
    assert m.days.tolist()[:3] == [20_001, 20_002, 20_001] and m.runs.tolist()[:3] == [0, 1, 0]


def test_a_bucket_of_the_64_bit_format_is_refused_with_what_to_do(tmp_path):
    live = IdIndex(tmp_path, []).with_segment("000000-000000", entries([1, 2], 0))
    for bucket in (tmp_path / live[0]).iterdir():  # as format 1 wrote them: (3, n)
        np.save(bucket, np.zeros((3, 1), np.uint64))
    with pytest.raises(IndexFormatError, match="offsets.json.*rebuilds the index"):
        IdIndex(tmp_path, live).lookup(identities([1]))


def _mapped_index_files(root) -> set[str]:
    """Files under ``root`` this process has memory-mapped now (Linux /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if str(root) in line}


def test_a_one_shot_lookup_unmaps_each_bucket_and_finds_the_same(tmp_path):
    """The driver's fraud-report lookup must not keep every touched index page resident (bench scale's
    driver memory grew with the index): keep_mapped=False leaves no bucket mapped, and matches as a read
    task's cached lookup does."""
    stored = spread(20_000, 3)
    live = IdIndex(tmp_path, []).with_run(0, entries(stored, run=0))
    wanted = np.concatenate([stored[::3], spread(500, 4)])
    one_shot = IdIndex(tmp_path, live).lookup(wanted, keep_mapped=False)
    assert _mapped_index_files(tmp_path) == set()
    cached_index = IdIndex(tmp_path, live)
    cached = cached_index.lookup(wanted)
    assert len(_mapped_index_files(tmp_path)) == 16  # one per bucket, held for the task's next batch
    for field in ("found", "contents", "days", "runs"):
        assert (getattr(one_shot, field) == getattr(cached, field)).all()
    assert one_shot.found.sum() == len(stored[::3])
