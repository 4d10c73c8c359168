"""The lookback cache and its id vocabulary: codes never move once given (but in a compaction, which
starts a new generation and rewrites every cached file to the same ids), a date file is trusted only
for the raw files and vocabulary it was coded with, the sorted history only for exactly the dates
and raw files it was made from, a killed write or compaction publishes nothing, the nightly
compaction check reads one footer while one date alone keeps the share live, and the vocabulary
stays within a small multiple of the live ids however often the card base turns over."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.bench.lookback_vocabulary import LOOKBACK_DAYS, Turnover, play_nights
from pipeline.datasets import lookback_cache as lookback_cache_module
from pipeline.datasets.id_vocabulary import NULL_CODE, IdVocabulary
from pipeline.datasets.lookback_cache import (
    CODED_SCHEMA,
    FRAUD_SCHEMA,
    FRAUDS_FILE,
    HISTORY_SCHEMA,
    MATCHED_SCHEMA,
    LookbackCache,
)

DAY = date(2026, 2, 3)


def coded_rows(n: int, vocabulary: IdVocabulary) -> pa.Table:
    codes = pa.array(np.arange(n, dtype=np.int32) % len(vocabulary))
    return pa.Table.from_arrays([pa.array([f"tx-{i}" for i in range(n)]), codes, codes, codes,
                                 pa.array(np.arange(n, dtype=np.int64) * 1_000_000), pa.array(np.linspace(1, 2, n))],
                                schema=CODED_SCHEMA)


def test_codes_never_move_as_the_vocabulary_grows():
    start = IdVocabulary.start()
    first, grown = start.code(pa.chunked_array([["card-b", None, "card-a", "card-b"]]))
    assert first.tolist() == [1, NULL_CODE, 2, 1] and len(grown) == 3
    again, grown_more = grown.code(pa.array(["card-c", "card-a", None, "card-b"]))
    assert again.tolist() == [3, 2, NULL_CODE, 1]  # a, b as before; c appended
    assert grown_more.generation == start.generation
    same, unchanged = grown_more.code(pa.array(["card-a"]))
    assert same.tolist() == [2] and unchanged is grown_more  # nothing new: the same vocabulary back
    assert IdVocabulary.start().generation != start.generation


def test_a_date_round_trips_for_its_key_and_vocabulary(tmp_path):
    cache, vocabulary = LookbackCache(tmp_path), IdVocabulary.start().code(pa.array(["a", "b", "c"]))[1]
    cache.write_vocabulary(vocabulary)
    rows = coded_rows(5, vocabulary)
    cache.write_date(DAY, "raw-files-1", vocabulary, rows)
    stored = cache.read_vocabulary()
    assert stored.generation == vocabulary.generation and stored.values.equals(vocabulary.values)
    assert cache.read_date(DAY, "raw-files-1", stored).equals(rows)
    longer = stored.code(pa.array(["d"]))[1]  # codes stay valid under a longer vocabulary
    assert cache.read_date(DAY, "raw-files-1", longer).equals(rows)


def test_a_date_is_a_miss_for_other_raw_files_or_another_vocabulary(tmp_path):
    cache, vocabulary = LookbackCache(tmp_path), IdVocabulary.start().code(pa.array(["a", "b", "c"]))[1]
    cache.write_date(DAY, "raw-files-1", vocabulary, coded_rows(5, vocabulary))
    assert cache.read_date(DAY, "raw-files-2", vocabulary) is None  # a late payment: a new raw file
    assert cache.read_date(DAY, "raw-files-1", IdVocabulary.start()) is None  # another generation
    shorter = IdVocabulary(vocabulary.generation, vocabulary.values.slice(0, 2))
    assert cache.read_date(DAY, "raw-files-1", shorter) is None  # its codes reach past this one
    assert cache.read_date(date(2026, 2, 4), "raw-files-1", vocabulary) is None  # never written
    cache.date_file(DAY).write_bytes(b"ARROW1 torn")
    assert cache.read_date(DAY, "raw-files-1", vocabulary) is None


def _crash_writing(table, path, **kwargs):
    raise KeyboardInterrupt("killed while writing")


def test_a_killed_write_leaves_the_previous_file_and_no_visible_leftover(tmp_path, monkeypatch):
    cache, vocabulary = LookbackCache(tmp_path), IdVocabulary.start().code(pa.array(["a", "b"]))[1]
    cache.write_vocabulary(vocabulary)
    before = coded_rows(4, vocabulary)
    cache.write_date(DAY, "raw-files-1", vocabulary, before)

    class Killed(pa.ipc.RecordBatchFileWriter):
        def write_table(self, table, max_chunksize=None):
            super().write_table(table.slice(0, 1))  # half the rows are on disk, then the kill
            raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(lookback_cache_module.pa.ipc, "new_file", Killed)
    grown = vocabulary.code(pa.array(["c"]))[1]
    with pytest.raises(KeyboardInterrupt):
        cache.write_date(DAY, "raw-files-2", grown, coded_rows(6, grown))
    with pytest.raises(KeyboardInterrupt):
        cache.write_vocabulary(grown)
    monkeypatch.undo()
    assert cache.read_date(DAY, "raw-files-1", vocabulary).equals(before)
    assert cache.read_date(DAY, "raw-files-2", grown) is None
    assert cache.read_vocabulary().values.equals(vocabulary.values)
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["date=2026-02-03.arrow", "ids.arrow"]


def test_discard_before_keeps_the_dates_a_build_may_read(tmp_path):
    cache, vocabulary = LookbackCache(tmp_path), IdVocabulary.start()
    for day in (date(2026, 2, 1), date(2026, 2, 2), DAY):
        cache.write_date(day, "k", vocabulary, coded_rows(0, vocabulary))
    (tmp_path / ".date=2026-02-04.arrow.tmp-123").write_bytes(b"left by a kill")
    removed = cache.discard_before(date(2026, 2, 2))
    assert sorted(p.name for p in removed) == [".date=2026-02-04.arrow.tmp-123", "date=2026-02-01.arrow"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["date=2026-02-02.arrow", "date=2026-02-03.arrow"]


def _days(*days: date) -> pa.Array:
    return pa.array([(d - date(1970, 1, 1)).days for d in days], pa.int32())


def test_fraud_reports_are_trusted_per_report_date_while_its_label_files_are_unchanged(tmp_path):
    cache, other = LookbackCache(tmp_path), date(2026, 2, 4)
    assert cache.read_frauds({DAY: "labels-1"}) == (FRAUD_SCHEMA.empty_table(), [DAY])  # nothing stored yet
    rows = pa.Table.from_arrays([_days(DAY, DAY, other), pa.array(["tx-1", "tx-2", "tx-3"]),
                                 pa.array([10, 20, 30], pa.int64())], schema=FRAUD_SCHEMA)
    cache.write_frauds(rows, {DAY: "labels-1", other: "labels-9"})
    stored, missing = cache.read_frauds({DAY: "labels-1", other: "labels-9"})
    assert stored.equals(rows) and missing == []
    stored, missing = cache.read_frauds({DAY: "labels-1", other: "labels-10", date(2026, 2, 5): "x"})
    assert stored.column("transaction_id").to_pylist() == ["tx-1", "tx-2"]  # 02-04 got a new label file
    assert missing == [other, date(2026, 2, 5)]
    (tmp_path / FRAUDS_FILE).write_bytes(b"ARROW1 torn")
    assert cache.read_frauds({DAY: "labels-1"})[1] == [DAY]


def test_matched_payments_hold_for_their_payment_dates_files_and_vocabulary(tmp_path):
    cache, vocabulary = LookbackCache(tmp_path), IdVocabulary.start().code(pa.array(["m-1", "m-2"]))[1]
    rows = pa.Table.from_arrays([_days(DAY, date(2026, 2, 4)), pa.array(["tx-1", "tx-2"]), pa.array([1, 2], pa.int32()),
                                 pa.array([5, 6], pa.int64())], schema=MATCHED_SCHEMA)
    keys = {DAY: "raw-1", date(2026, 2, 4): "raw-2"}
    cache.write_matched(rows, keys, vocabulary)
    assert cache.read_matched(keys, vocabulary).equals(rows)
    assert cache.read_matched(keys, vocabulary.code(pa.array(["m-3"]))[1]).equals(rows)  # codes hold when it grows
    late = cache.read_matched({DAY: "raw-1", date(2026, 2, 4): "raw-2-and-a-late-file"}, vocabulary)
    assert late.column("transaction_id").to_pylist() == ["tx-1"]
    assert cache.read_matched({DAY: "raw-1"}, vocabulary).num_rows == 1  # a date no longer asked for: not returned
    assert cache.read_matched(keys, IdVocabulary.start()).num_rows == 0  # codes of another generation
    shorter = IdVocabulary(vocabulary.generation, vocabulary.values.slice(0, 2))
    assert cache.read_matched(keys, shorter).num_rows == 0  # its codes reach past this one


def _decoded(table: pa.Table, vocabulary: IdVocabulary, columns=("card", "merchant", "country")) -> dict:
    return {name: vocabulary.values.take(table.column(name).combine_chunks()).to_pylist() for name in columns}


def _cache_with_dead_ids(tmp_path: Path) -> tuple[LookbackCache, IdVocabulary, dict]:
    """A cache whose vocabulary holds 100 ids of which its files use 10: two dates, matches, reports."""
    cache = LookbackCache(tmp_path)
    vocabulary = IdVocabulary.start().code(pa.array([f"id-{i}" for i in range(100)]))[1]
    cache.write_vocabulary(vocabulary)
    dates = {}
    for day, offset in ((DAY, 3), (date(2026, 2, 4), 50)):
        codes = pa.array(np.array([offset, offset + 2, 0, offset + 4, offset], np.int32))  # one null
        dates[day] = pa.Table.from_arrays([pa.array([f"tx-{offset}-{i}" for i in range(5)]), codes, codes, codes,
                                           pa.array(np.arange(5, dtype=np.int64)), pa.array(np.ones(5))],
                                          schema=CODED_SCHEMA)
        cache.write_date(day, f"raw-{offset}", vocabulary, dates[day])
    matched = pa.Table.from_arrays([_days(DAY), pa.array(["tx-3-0"]), pa.array([90], pa.int32()),
                                    pa.array([0], pa.int64())], schema=MATCHED_SCHEMA)
    cache.write_matched(matched, {DAY: "raw-3"}, vocabulary)
    cache.write_frauds(pa.Table.from_arrays([_days(DAY), pa.array(["tx-3-0"]), pa.array([7], pa.int64())],
                                            schema=FRAUD_SCHEMA), {DAY: "labels-1"})
    return cache, vocabulary, {"dates": dates, "matched": matched}


def test_compaction_keeps_the_ids_of_every_cached_file_and_drops_the_rest(tmp_path):
    cache, vocabulary, stored = _cache_with_dead_ids(tmp_path / "_lookback")
    frauds_before = (cache.root / FRAUDS_FILE).read_bytes()
    assert cache.live_ids(vocabulary).sum() == 1 + 6 + 1  # null, 3 per date, the matched merchant
    compacted = cache.compact(min_live_share=0.5)
    assert compacted is not None and compacted.generation != vocabulary.generation and len(compacted) == 8
    assert cache.read_vocabulary().values.equals(compacted.values)
    for day, offset in ((DAY, 3), (date(2026, 2, 4), 50)):
        assert cache.read_date(day, f"raw-{offset}", vocabulary) is None  # old codes: another generation
        rows = cache.read_date(day, f"raw-{offset}", compacted)
        assert _decoded(rows, compacted) == _decoded(stored["dates"][day], vocabulary)  # the same ids
        assert rows.drop_columns(["card", "merchant", "country"]).equals(
            stored["dates"][day].drop_columns(["card", "merchant", "country"]))
    matched = cache.read_matched({DAY: "raw-3"}, compacted)
    assert _decoded(matched, compacted, ["merchant"]) == _decoded(stored["matched"], vocabulary, ["merchant"])
    assert (cache.root / FRAUDS_FILE).read_bytes() == frauds_before
    assert not [p for p in tmp_path.iterdir() if p.name != "_lookback"]  # no staging directory left


def test_compaction_waits_until_the_live_share_falls_under_the_bound(tmp_path):
    cache, vocabulary, _ = _cache_with_dead_ids(tmp_path / "_lookback")
    assert cache.compact(min_live_share=0.05) is None  # 8 of 101 live: over 5%
    assert cache.read_vocabulary().generation == vocabulary.generation
    assert lookback_cache_module.MIN_LIVE_SHARE == 0.5
    cache.discard_before(DAY)  # the nightly call compacts at the default bound
    assert len(cache.read_vocabulary()) == 8


def test_a_compaction_killed_before_its_exchange_leaves_the_old_generation_usable(tmp_path, monkeypatch):
    cache, vocabulary, stored = _cache_with_dead_ids(tmp_path / "_lookback")
    writes = []
    new_file = pa.ipc.new_file

    def killed_on_the_third_file(sink, schema, **kwargs):
        writes.append(schema)
        if len(writes) == 3:
            raise KeyboardInterrupt("killed while compacting")
        return new_file(sink, schema, **kwargs)

    monkeypatch.setattr(lookback_cache_module.pa.ipc, "new_file", killed_on_the_third_file)
    with pytest.raises(KeyboardInterrupt):
        cache.compact(min_live_share=0.5)
    monkeypatch.undo()
    assert cache.read_vocabulary().values.equals(vocabulary.values)
    assert cache.read_vocabulary().generation == vocabulary.generation
    assert cache.read_date(DAY, "raw-3", vocabulary).equals(stored["dates"][DAY])
    assert cache.read_matched({DAY: "raw-3"}, vocabulary).equals(stored["matched"])
    killed = tmp_path / "._lookback.tmp-999999"  # what a SIGKILL (no cleanup) would leave
    killed.mkdir()
    (killed / "ids.arrow").write_bytes(b"half")
    removed = cache.discard_before(DAY, min_live_share=0.0)
    assert killed in removed and not killed.exists()
    assert cache.read_date(DAY, "raw-3", cache.read_vocabulary()).equals(stored["dates"][DAY])


def test_after_ten_turnovers_of_the_card_base_the_vocabulary_stays_near_the_live_set(tmp_path):
    base = Turnover(cards=300, payments_per_day=300, turnover_days=10, merchants=50)  # ~1,200 cards live
    nights = play_nights(tmp_path, base, turnovers=10, hash_once=False)
    settled = nights[LOOKBACK_DAYS + 1:]
    assert max(n.vocabulary_ids / n.live_ids for n in settled) <= 2.5  # compacts under 1/2 live, plus a night's ids
    without = play_nights(tmp_path / "never", base, turnovers=10, min_live_share=0.0)
    assert without[-1].vocabulary_ids > 3 * without[-1].live_ids  # what the bound prevents


def test_coding_several_columns_at_once_equals_coding_them_in_turn():
    vocabulary = IdVocabulary.start().code(pa.array(["a", "b"]))[1]
    columns = [pa.chunked_array([["c", "a"], [None, "d"]]), pa.array(["d", "e", "b"]), pa.array([], pa.string())]
    together, grown = vocabulary.code_columns(*columns)
    in_turn, step = [], vocabulary
    for column in columns:
        codes, step = step.code(column)
        in_turn.append(codes)
    assert [c.tolist() for c in together] == [c.tolist() for c in in_turn]
    assert grown.values.equals(step.values) and grown.generation == vocabulary.generation


def history_rows(n: int) -> pa.Table:
    codes = pa.array(np.arange(n, dtype=np.int32) % 3)
    times = pa.array(np.arange(n, dtype=np.int64))
    return pa.Table.from_arrays([codes, codes, codes, times, pa.array(np.ones(n)), codes, times], schema=HISTORY_SCHEMA)


def test_the_sorted_history_serves_a_lookback_only_from_its_dates_raw_files_and_vocabulary(tmp_path):
    cache, vocabulary = LookbackCache(tmp_path), IdVocabulary.start().code(pa.array(["a", "b"]))[1]
    cache.write_vocabulary(vocabulary)
    d1, d2, d3, d4 = (date(2026, 2, day) for day in (3, 4, 5, 6))
    cache.write_history(history_rows(6), {d1: "raw-1", d2: "raw-2"}, vocabulary)

    def served(start, keys, vocab=vocabulary):
        found = cache.read_history(start, keys, vocab)
        return found and (found[0].equals(history_rows(6)), found[1])

    assert served(d1, {d1: "raw-1", d2: "raw-2"}) == (True, [])
    assert served(d1, {d1: "raw-1", d2: "raw-2", d3: "raw-3", d4: "raw-4"}) == (True, [d3, d4])  # read those
    assert served(d2, {d2: "raw-2", d3: "raw-3"}) == (True, [d3])  # 02-03 is older: cut by the caller
    assert served(d1, {d1: "raw-1", d2: "raw-2"}, vocabulary.code(pa.array(["c"]))[1]) == (True, [])
    assert served(d1, {d1: "raw-1", d2: "raw-9", d3: "raw-3"}) is None  # a late payment on 02-04
    assert served(d1, {d2: "raw-2"}) is None  # 02-03 has no payments now: the history holds some
    assert served(date(2026, 2, 2), {date(2026, 2, 2): "raw-0", d1: "raw-1", d2: "raw-2"}) is None  # starts later
    assert served(d1, {d1: "raw-1"}) is None  # holds 02-04, after this lookback: a build of earlier dates
    assert served(d3, {d3: "raw-3"}) is None  # holds nothing of this lookback
    assert served(d1, {d1: "raw-1", d2: "raw-2"}, IdVocabulary.start()) is None  # another generation
    assert served(d1, {d1: "raw-1", d2: "raw-2"}, IdVocabulary(vocabulary.generation, vocabulary.values.slice(0, 2))) is None
    cache.write_date(d1, "raw-1", vocabulary, coded_rows(2, vocabulary))
    compacted = cache.compact(min_live_share=1.0)  # a new generation: the history is not carried over
    assert compacted is not None and cache.read_history(d1, {d1: "raw-1", d2: "raw-2"}, compacted) is None


def test_the_compaction_check_reads_no_date_file_while_the_newest_alone_uses_the_live_share(tmp_path, monkeypatch):
    cache = LookbackCache(tmp_path)
    vocabulary = IdVocabulary.start().code(pa.array([f"id-{i}" for i in range(10)]))[1]  # 11 codes
    cache.write_vocabulary(vocabulary)
    cache.write_date(date(2026, 2, 1), "k", vocabulary, coded_rows(1, vocabulary))  # older: null only
    cache.write_date(DAY, "k", vocabulary, coded_rows(6, vocabulary))  # 6 distinct codes >= 11 / 2

    def read_every_file(self, vocabulary):
        raise AssertionError("the check read every date file")

    with monkeypatch.context() as patched:
        patched.setattr(LookbackCache, "_coded_files", read_every_file)
        assert cache.compact(min_live_share=0.5) is None
        with pytest.raises(AssertionError, match="read every date file"):
            cache.compact(min_live_share=0.6)  # 6 < 6.6: only reading every file can tell
    many_rows_one_id = pa.Table.from_arrays(  # 40 rows, 2 distinct codes (null's and one id's)
        [pa.array([f"tx-{i}" for i in range(40)]), *[pa.array(np.ones(40, np.int32))] * 3,
         pa.array(np.arange(40, dtype=np.int64)), pa.array(np.ones(40))], schema=CODED_SCHEMA)
    cache.date_file(DAY).unlink()
    cache.write_date(date(2026, 2, 5), "k", vocabulary, many_rows_one_id)  # the newest: 40 rows, 2 of 11 codes
    compacted = cache.compact(min_live_share=0.5)
    assert compacted is not None and len(compacted) == 2  # null and the one id


def test_a_history_write_killed_midway_leaves_the_previous_history_serving(tmp_path, monkeypatch):
    cache, vocabulary = LookbackCache(tmp_path), IdVocabulary.start().code(pa.array(["a", "b"]))[1]
    cache.write_vocabulary(vocabulary)
    cache.write_history(history_rows(6), {DAY: "raw-1"}, vocabulary)

    class Killed(pa.ipc.RecordBatchFileWriter):
        def write_table(self, table, max_chunksize=None):
            super().write_table(table.slice(0, 1))  # a row is on disk, then the kill
            raise KeyboardInterrupt("killed while storing the history")

    monkeypatch.setattr(lookback_cache_module.pa.ipc, "new_file", Killed)
    with pytest.raises(KeyboardInterrupt):
        cache.write_history(history_rows(9), {date(2026, 2, 4): "raw-2"}, vocabulary)
    monkeypatch.undo()
    rows, later = cache.read_history(DAY, {DAY: "raw-1", date(2026, 2, 4): "raw-2"}, vocabulary)
    assert rows.equals(history_rows(6)) and later == [date(2026, 2, 4)]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
