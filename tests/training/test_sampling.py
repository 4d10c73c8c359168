"""Negative sampling of the train split: every fraud kept, a seeded share of the rest, per epoch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.training.config import ConfigError, train_config_from_dict
from pipeline.training.data import DataConfigError, TrainStream, plan_rank_pieces
from pipeline.training.sampling import kept_rows, sample_rows
from tests.training.dataset_factory import train_config_dict


def test_a_sample_keeps_every_positive_and_the_rate_of_the_rest():
    positives = np.array([3, 17, 40])
    rows = sample_rows(positives, 1000, 0.1, np.random.default_rng(1))
    assert set(positives) <= set(rows)
    assert len(rows) == kept_rows(3, 1000, 0.1) == 3 + 100
    assert len(np.unique(rows)) == len(rows) and np.all(np.diff(rows) > 0)
    assert np.array_equal(sample_rows(positives, 1000, 1.0, np.random.default_rng(1)), np.arange(1000))


def _stream(root, manifest, rate, rank=0, world=2, seed=5) -> TrainStream:
    return TrainStream(root, manifest, rank, world, micro_batch_rows=8, accumulation_steps=2,
                       shuffle_window_rows=300, seed=seed, negative_sample_rate=rate)


def _noise_and_label(stream: TrainStream, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """Every row the stream's epoch yields before cutting it into steps (a row's noise value names it)."""
    col = list(stream.manifest.numeric_features).index("noise")
    parts = list(stream._shuffled_rows(epoch, 0))
    return (np.concatenate([numeric[:, col] for numeric, _, _ in parts]),
            np.concatenate([label for _, _, label in parts]))


def test_an_epoch_keeps_every_fraud_of_the_rank_and_a_tenth_of_the_genuine_rows(tiny_dataset, tiny_manifest):
    pieces = plan_rank_pieces(tiny_dataset, tiny_manifest.shards_for("train"), 0, 2)
    rank_rows = sum(p.rows for p in pieces)
    stream = _stream(tiny_dataset, tiny_manifest, 0.1)
    noise, label = _noise_and_label(stream, 0)
    full_noise, full_label = _noise_and_label(_stream(tiny_dataset, tiny_manifest, 1.0), 0)
    assert len(full_noise) == rank_rows
    frauds = set(full_noise[full_label == 1].tolist())
    assert frauds and set(noise[label == 1].tolist()) == frauds  # every fraud of this rank, once
    assert len(np.unique(noise)) == len(noise)
    assert set(noise.tolist()) <= set(full_noise.tolist())
    genuine = rank_rows - len(frauds)
    assert (label == 0).sum() == pytest.approx(0.1 * genuine, abs=len(pieces))  # rounded per piece


def test_epochs_draw_other_genuine_rows_and_replay_their_own(tiny_dataset, tiny_manifest):
    a_noise, a_label = _noise_and_label(_stream(tiny_dataset, tiny_manifest, 0.1), 1)
    b_noise, _ = _noise_and_label(_stream(tiny_dataset, tiny_manifest, 0.1), 1)
    c_noise, c_label = _noise_and_label(_stream(tiny_dataset, tiny_manifest, 0.1), 2)
    assert np.array_equal(a_noise, b_noise)  # a pure function of (seed, rank, epoch)
    assert set(a_noise[a_label == 1].tolist()) == set(c_noise[c_label == 1].tolist())
    genuine_a, genuine_c = set(a_noise[a_label == 0].tolist()), set(c_noise[c_label == 0].tolist())
    assert len(genuine_a & genuine_c) < 0.5 * len(genuine_a)  # mostly other rows (a tenth overlap expected)


def test_sampled_epochs_are_shorter_equal_over_ranks_and_resume_exactly(tiny_dataset, tiny_manifest):
    full = _stream(tiny_dataset, tiny_manifest, 1.0)
    sampled = [_stream(tiny_dataset, tiny_manifest, 0.1, rank=r) for r in range(2)]
    assert sampled[0].steps_per_epoch == sampled[1].steps_per_epoch
    assert 0 < sampled[0].steps_per_epoch < 0.2 * full.steps_per_epoch
    steps = list(sampled[0].epoch(3))
    tail = list(sampled[0].epoch(3, start_step=2))
    assert len(steps) == sampled[0].steps_per_epoch
    assert all(torch.equal(x.numeric.nan_to_num(-7.0), y.numeric.nan_to_num(-7.0))
               for s, t in zip(steps[2:], tail, strict=True) for x, y in zip(s, t, strict=True))


def test_a_rate_outside_zero_one_is_refused(tiny_dataset, tiny_manifest):
    with pytest.raises(ConfigError, match="negative_sample_rate"):
        train_config_from_dict(train_config_dict({"data": {"negative_sample_rate": 0.0}}))
    with pytest.raises(DataConfigError, match="negative_sample_rate"):
        _stream(tiny_dataset, tiny_manifest, 1.5)
