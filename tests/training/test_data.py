"""Per-rank shard planning, deterministic streaming shuffle, data position for resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.datasets.reader import read_split
from pipeline.training.data import (
    DataConfigError,
    TrainStream,
    bin_fit_sample,
    feature_moments,
    iter_eval_chunks,
    normalization_from_moments,
    plan_rank_pieces,
    split_global_batch,
)


def _rows(pieces) -> set[tuple[str, int, int]]:
    return {(p.path, p.row_group, i) for p in pieces for i in range(p.start, p.stop)}


def test_whole_shards_per_rank_when_the_count_divides(tiny_dataset, tiny_manifest):
    shards = tiny_manifest.shards_for("train")
    plans = [plan_rank_pieces(tiny_dataset, shards, r, 2) for r in range(2)]
    files = [{p.path for p in plan} for plan in plans]
    assert files[0].isdisjoint(files[1])
    assert all(p.start == 0 for plan in plans for p in plan)  # whole row groups of whole shards
    assert len(_rows(plans[0]) | _rows(plans[1])) == sum(s.rows for s in shards)


def test_row_split_covers_every_row_exactly_once_otherwise(tiny_dataset, tiny_manifest):
    shards = tiny_manifest.shards_for("train")
    world = 3  # 8 shards do not divide by 3
    plans = [plan_rank_pieces(tiny_dataset, shards, r, world) for r in range(world)]
    sets = [_rows(p) for p in plans]
    assert sum(len(s) for s in sets) == len(set().union(*sets)) == sum(s.rows for s in shards)
    sizes = [len(s) for s in sets]
    assert max(sizes) - min(sizes) <= 1


def _stream(root, manifest, rank=0, world=2, window=300, seed=5) -> TrainStream:
    return TrainStream(root, manifest, rank, world, micro_batch_rows=32, accumulation_steps=2,
                       shuffle_window_rows=window, seed=seed)


def _labels_and_features(steps) -> list[torch.Tensor]:
    return [torch.cat([torch.cat([b.numeric.nan_to_num(-7.0), b.label[:, None]], 1) for b in step]) for step in steps]


def test_epoch_is_a_pure_function_of_seed_and_epoch(tiny_dataset, tiny_manifest):
    a = _labels_and_features(_stream(tiny_dataset, tiny_manifest).epoch(1))
    b = _labels_and_features(_stream(tiny_dataset, tiny_manifest).epoch(1))
    c = _labels_and_features(_stream(tiny_dataset, tiny_manifest).epoch(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(torch.cat(a), torch.cat(c))


def test_resume_from_a_data_position_yields_the_rest_of_the_epoch(tiny_dataset, tiny_manifest):
    stream = _stream(tiny_dataset, tiny_manifest)
    full = _labels_and_features(stream.epoch(0))
    tail = _labels_and_features(stream.epoch(0, start_step=5))
    assert len(tail) == len(full) - 5
    assert all(torch.equal(x, y) for x, y in zip(full[5:], tail, strict=True))


def test_steps_have_the_configured_geometry_and_rows_do_not_repeat(tiny_dataset, tiny_manifest):
    stream = _stream(tiny_dataset, tiny_manifest)
    other = _stream(tiny_dataset, tiny_manifest, rank=1)
    assert stream.steps_per_epoch == other.steps_per_epoch == 1200 // 64
    steps = list(stream.epoch(0))
    assert len(steps) == stream.steps_per_epoch
    assert all(len(step) == 2 and all(len(b) == 32 for b in step) for step in steps)
    rows = torch.cat([b.numeric for step in steps for b in step])
    noise = rows[:, list(tiny_manifest.numeric_features).index("noise")]
    assert noise.unique().numel() == noise.numel()  # continuous column: a repeated value = a repeated row


def test_the_shuffle_window_bounds_what_is_held_but_not_the_result_size(tiny_dataset, tiny_manifest):
    small = list(_stream(tiny_dataset, tiny_manifest, window=1).epoch(0))
    assert len(small) == _stream(tiny_dataset, tiny_manifest).steps_per_epoch


def test_a_batch_larger_than_the_rank_share_is_a_clear_error(tiny_dataset, tiny_manifest):
    with pytest.raises(DataConfigError, match="global_batch_size"):
        TrainStream(tiny_dataset, tiny_manifest, 0, 2, micro_batch_rows=2000, accumulation_steps=1,
                    shuffle_window_rows=100, seed=0)


def test_moments_summed_over_ranks_give_training_mean_and_std(tiny_dataset: Path, tiny_manifest):
    moments = sum(feature_moments(tiny_dataset, tiny_manifest, r, 2) for r in range(2))
    mean, std = normalization_from_moments(moments)
    frame = read_split(tiny_dataset, tiny_manifest, "train")
    # The model standardises squashed values (signed log), so the statistics are of those.
    squashed = np.sign(frame[list(tiny_manifest.numeric_features)]) * np.log1p(frame[list(tiny_manifest.numeric_features)].abs())
    np.testing.assert_allclose(mean.numpy(), squashed.mean().to_numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(std.numpy(), squashed.std(ddof=0).to_numpy(), rtol=1e-3, atol=1e-5)


def _rows_as_set(numeric: np.ndarray, labels: np.ndarray) -> set[tuple]:
    return {tuple(row) for row in np.column_stack([np.nan_to_num(numeric, nan=-7.0), labels]).tolist()}


def test_bin_fit_sample_is_the_whole_train_split_when_it_fits(tiny_dataset, tiny_manifest):
    numeric, labels = bin_fit_sample(tiny_dataset, tiny_manifest, max_rows=10_000, seed=0)
    frame = read_split(tiny_dataset, tiny_manifest, "train")
    expected = frame[list(tiny_manifest.numeric_features)].to_numpy(np.float32)
    assert numeric.shape == expected.shape and labels.sum() == frame["label"].sum()
    assert _rows_as_set(numeric, labels) == _rows_as_set(expected, frame["label"].to_numpy(np.float32))


def test_bin_fit_sample_is_a_seeded_subset_of_about_the_requested_size(tiny_dataset, tiny_manifest):
    numeric, labels = bin_fit_sample(tiny_dataset, tiny_manifest, max_rows=600, seed=1)
    again, _ = bin_fit_sample(tiny_dataset, tiny_manifest, max_rows=600, seed=1)
    other, _ = bin_fit_sample(tiny_dataset, tiny_manifest, max_rows=600, seed=2)
    assert 450 < len(numeric) < 750  # 2400 train rows, each kept with probability 1/4
    np.testing.assert_array_equal(numeric, again)
    assert not np.array_equal(numeric[:100], other[:100])
    everything = bin_fit_sample(tiny_dataset, tiny_manifest, max_rows=10_000, seed=0)
    assert _rows_as_set(numeric, labels) <= _rows_as_set(*everything)


def test_eval_chunks_cover_the_split_in_order_with_ids(tiny_dataset, tiny_manifest):
    chunks = list(iter_eval_chunks(tiny_dataset, tiny_manifest, "validation", 0, 1, with_ids=True))
    frame = read_split(tiny_dataset, tiny_manifest, "validation")
    labels = torch.cat([b.label for b, _ in chunks]).numpy()
    ids = [t for _, table in chunks for t in table.column("transaction_id").to_pylist()]
    assert ids == frame["transaction_id"].tolist()
    np.testing.assert_array_equal(labels, frame["label"].to_numpy(dtype=np.float32))


def test_a_sampled_validation_keeps_every_fraud_and_the_same_share_of_genuine_rows_each_read(tiny_dataset,
                                                                                              tiny_manifest):
    def read(rank: int, seed: int = 5) -> tuple[list[str], np.ndarray]:
        chunks = list(iter_eval_chunks(tiny_dataset, tiny_manifest, "validation", rank, 2, with_ids=True,
                                       negative_rate=0.25, seed=seed))
        return ([t for _, table in chunks for t in table.column("transaction_id").to_pylist()],
                torch.cat([b.label for b, _ in chunks]).numpy())

    frame = read_split(tiny_dataset, tiny_manifest, "validation")
    (ids0, labels0), (ids1, labels1) = read(0), read(1)
    ids, labels = ids0 + ids1, np.concatenate([labels0, labels1])
    frauds = set(frame.loc[frame["label"] == 1, "transaction_id"])
    genuine = len(frame) - len(frauds)
    assert {i for i, y in zip(ids, labels, strict=True) if y == 1} == frauds and len(frauds) > 0
    assert 0.2 * genuine < int((labels == 0).sum()) < 0.3 * genuine
    assert set(ids) <= set(frame["transaction_id"]) and len(set(ids)) == len(ids)
    assert read(0)[0] == ids0  # the same rows on every read (every epoch)
    assert read(0, seed=6)[0] != ids0


def test_the_global_batch_splits_over_processes_and_accumulation_steps_or_says_why_not():
    assert split_global_batch(4096, 2, 4) == 512  # 2 ranks x 4 micro-batches x 512 rows
    assert split_global_batch(96, 3, 1) == 32
    with pytest.raises(DataConfigError, match=r"global_batch_size=100 does not split evenly over 3 processes x 2 "):
        split_global_batch(100, 3, 2)
