"""The scale bench's parts: shards that scale the portfolio, the identity-check phase."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.bench import scale
from pipeline.contract import Kind
from pipeline.ingest.raw_commit import commit_raw_run, raw_table
from pipeline.ingest.raw_layout import RawStore
from pipeline.simulation import load_simulation_config, simulate

MB = 2**20


def test_shards_are_disjoint_portfolios_of_the_dev_shape() -> None:
    base = load_simulation_config("dev")
    first, second = scale.shard_simulation(base, 0, quick=True), scale.shard_simulation(base, 1, quick=True)
    assert first.seed != second.seed
    assert first.num_cards == round(base.num_cards * scale.QUICK_CARD_SHARE)
    assert first.tx_per_card_per_day == base.tx_per_card_per_day
    small = [scale.shard_simulation(base, i, quick=True) for i in (0, 1)]
    sims = [simulate(dataclasses.replace(c, days=2, num_cards=200, num_merchants=100)) for c in small]
    frames = [scale.prefix_ids(s.transactions, i) for i, s in enumerate(sims)]
    for column in ("card_id", "merchant_id"):
        assert not set(frames[0][column]) & set(frames[1][column])
    assert not set(frames[0]["transaction_id"]) & set(frames[1]["transaction_id"])
    # Missing devices stay missing, present ones get the prefix.
    raw = sims[0].transactions["device_id"]
    assert frames[0]["device_id"].isna().tolist() == raw.isna().tolist()
    assert (frames[0]["device_id"][raw.notna()] == "s0." + raw[raw.notna()]).all()


def test_identity_check_phase_looks_the_night_up_in_the_index(tmp_path: Path, state_dir: Path) -> None:
    store = RawStore(tmp_path / "raw")
    night = scale.commit_shard_history(store, load_simulation_config("dev"), 0, quick=True)
    records = tmp_path / "night.parquet"
    pq.write_table(raw_table(Kind.TRANSACTION, night.transactions), records)
    before = scale.check_phase(store.root, records, "whole")
    assert before["records"] == len(night.transactions) > 0 and before["found"] == 0
    with store.locked():
        commit_raw_run(store, "night", night.transactions, night.labels)
    assert scale.check_phase(store.root, records, "whole")["found"] == len(night.transactions)
    # One lookup task, from the probe the whole check wrote: one of the 16 buckets, every record found.
    task = scale.check_phase(store.root, records, "task")
    assert 0 < task["records"] < len(night.transactions) / 8 and task["found"] == task["records"]


@pytest.mark.parametrize("sizes, expected", [([{"x": 2.0}, {"x": 3.0}], 1.5), ([{"x": 2.0}, {}], None)])
def test_growth_is_the_largest_size_over_the_smallest(sizes: list[dict], expected: float | None) -> None:
    assert scale.growth(sizes, "x") == expected
