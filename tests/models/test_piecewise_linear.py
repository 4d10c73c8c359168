"""Tree-fitted bin edges and the piecewise-linear encoding that applies them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.piecewise_linear import PiecewiseLinearEncoding, fit_bin_edges, tree_bin_edges


def test_a_label_threshold_becomes_an_edge_between_the_neighbouring_values():
    rng = np.random.default_rng(0)
    x = np.round(rng.uniform(0, 3000, 20_000), 2).astype(np.float32)
    y = (x > 1234.5).astype(np.float32)
    edges = tree_bin_edges(x, y, max_bins=8)
    below, above = x[x <= 1234.5].max(), x[x > 1234.5].min()
    assert ((edges >= below) & (edges < above)).any(), edges
    assert edges.dtype == np.float32 and np.all(np.diff(edges) > 0)
    assert edges[0] == x.min() and edges[-1] == x.max()


def test_a_split_between_adjacent_float32_values_keeps_them_apart():
    below = np.float32(1234.5)
    above = np.nextafter(below, np.float32(np.inf))  # no float32 lies strictly between them
    x = np.repeat(np.array([below, above], dtype=np.float32), 500)
    edges = tree_bin_edges(x, (x == above).astype(np.float32), max_bins=4)
    assert edges.tolist() == [below, below, above]  # the threshold is `below`: x <= t stays left
    ple = PiecewiseLinearEncoding(1, 2)
    ple.set_edges(torch.from_numpy(edges)[None])
    encoded = ple(torch.tensor([[below], [above]]))  # fills of the 2 bins, then their steps
    assert encoded[0, 0].tolist() == [0.0, 0.0, 0.0, 0.0] and encoded[1, 0].tolist() == [0.0, 1.0, 0.0, 1.0]


def test_bins_are_capped_and_need_enough_rows_and_a_gain():
    rng = np.random.default_rng(1)
    x = rng.normal(size=50_000).astype(np.float32)
    y = (rng.random(50_000) < 1 / (1 + np.exp(-3 * x))).astype(np.float32)
    assert len(tree_bin_edges(x, y, max_bins=5)) == 6
    assert len(tree_bin_edges(np.array([0, 1] * 100, np.float32), np.array([0, 1] * 100, np.float32), 16)) == 3
    # Labels independent of a two-valued feature: no split gains, one bin over the range.
    assert tree_bin_edges(np.array([0, 1] * 100, np.float32), np.array([0, 0, 1, 1] * 50, np.float32), 16).tolist() \
        == [0.0, 1.0]


def test_non_finite_values_are_ignored_and_an_empty_feature_has_no_edges():
    x = np.array([np.nan, np.inf, -np.inf, 1.0, 2.0] * 50, dtype=np.float32)
    edges = tree_bin_edges(x, np.zeros(len(x), np.float32), max_bins=4)
    assert edges.tolist() == [1.0, 2.0]
    assert tree_bin_edges(np.full(10, np.nan, np.float32), np.zeros(10, np.float32), 4).size == 0


def test_fit_pads_short_features_with_zero_width_bins_that_encode_as_zero():
    x = np.stack([np.linspace(0, 1, 1000), np.full(1000, np.nan)], axis=1).astype(np.float32)
    y = (x[:, 0] > 0.5).astype(np.float32)
    edges = fit_bin_edges(x, y, max_bins=4)
    assert edges.shape == (2, 5) and np.all(np.diff(edges, axis=1) >= 0)
    assert edges[1].tolist() == [0.0] * 5
    ple = PiecewiseLinearEncoding(2, 4)
    ple.set_edges(torch.from_numpy(edges))
    encoded = ple(torch.tensor([[2.0, 3.0]]))
    real_bins = int((np.diff(edges[0]) > 0).sum())
    assert encoded[0, 0].tolist() == ([1.0] * real_bins + [0.0] * (4 - real_bins)) * 2  # fills, then steps
    assert encoded[0, 1].tolist() == [0.0] * 8


def test_encoding_is_the_cumulative_fill_of_the_bins_then_the_step_at_each_lower_edge():
    ple = PiecewiseLinearEncoding(1, 2)
    ple.set_edges(torch.tensor([[0.0, 10.0, 30.0]]))
    x = torch.tensor([[-1.0], [0.0], [5.0], [10.0], [10.5], [100.0]])
    expected = [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.5, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0],
                [1.0, 0.025, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    torch.testing.assert_close(ple(x)[:, 0], torch.tensor(expected))


def test_set_edges_refuses_unsorted_or_misshaped_edges():
    ple = PiecewiseLinearEncoding(1, 2)
    with pytest.raises(ValueError, match="sorted"):
        ple.set_edges(torch.tensor([[0.0, 2.0, 1.0]]))
    with pytest.raises(ValueError, match="shape"):
        ple.set_edges(torch.zeros(2, 3))
