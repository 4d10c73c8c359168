"""Nights whose lookback cache is compacted give the same feature rows as builds from the raw store
alone: a compaction changes codes, never the ids, features or matches they stand for."""

from __future__ import annotations

import uuid
from datetime import timedelta

import numpy as np
import pyarrow as pa

from pipeline.datasets import lookback_cache as lookback_cache_module
from pipeline.datasets.feature_table import FeatureTable
from pipeline.datasets.id_vocabulary import IdVocabulary
from pipeline.datasets.lookback_cache import LookbackCache
from pipeline.ingest.dataset_plan import plan_nightly
from pipeline.ingest.feature_update import feature_table_root, plan_dates
from pipeline.ingest.raw_layout import RawStore
from tests.ingest.test_block_payments import build_without_cache, night, sim  # noqa: F401 (a fixture)
from tests.ingest.test_feature_update import FIRST_NIGHT, config, deliver


def bloat_with_dead_ids(cache: LookbackCache) -> IdVocabulary:
    """Rewrite the cache under a new generation whose ids are in reverse order, two dead ids before
    each (a third live: the nightly compaction must run and move every code)."""
    vocabulary = cache.read_vocabulary()
    dated, matched = cache._coded_files(vocabulary)
    n, live = len(vocabulary), vocabulary.values.to_pylist()[1:][::-1]
    values = [None] + [v for i, value in enumerate(live) for v in (f"dead-{i}-a", f"dead-{i}-b", value)]
    bloated = IdVocabulary(uuid.uuid4().hex, pa.array(values, pa.string()))
    remap = np.zeros(n, np.int32)
    remap[1:] = 3 * (n - np.arange(1, n))  # old code c is live[n - 1 - c], now at 3 (n - c)
    assert bloated.values.take(pa.array(remap[1:])).equals(vocabulary.values.slice(1))
    cache.write_vocabulary(bloated)
    for day, (rows, key) in dated.items():
        cache.write_date(day, key, bloated, lookback_cache_module._remapped(rows, remap))
    if matched:
        cache.write_matched(lookback_cache_module._remapped(matched[0], remap), matched[1], bloated)
    return bloated


def test_nights_on_a_compacted_cache_equal_builds_without_a_cache(state_dir, sim, tmp_path):  # noqa: F811
    cfg, store, delivered = config(), RawStore(state_dir / "raw"), set()
    table = FeatureTable(feature_table_root(cfg.dataset.feature_table, store))
    cache = table.lookback_cache()
    for n in range(3):  # late payments on night 1, back-dated fraud reports on night 2
        deliver(store, sim, n, delivered)
        bloated = bloat_with_dead_ids(cache) if n else None
        plan = plan_nightly(FIRST_NIGHT + timedelta(days=n), cfg.dataset)
        assert night(store, table, plan, cfg), n
        if bloated is not None:  # the night compacted it: a new generation, about a third as long
            after = cache.read_vocabulary()
            assert after.generation != bloated.generation and len(after) < 0.4 * len(bloated), n
        cached = table.read(plan_dates(plan)).sort_by("transaction_id")
        assert cached.equals(build_without_cache(store, plan, cfg, tmp_path / f"fresh-{n}")), n
