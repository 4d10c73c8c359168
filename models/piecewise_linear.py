"""Piecewise-linear encoding (PLE) of numeric features with target-aware bin edges.

Gorishniy et al. 2022, "On Embeddings for Numerical Features in Tabular Deep Learning": a value
``x`` in bin ``t`` of edges ``b_0 < ... < b_T`` becomes ``T`` numbers: 1 for every bin below ``t``,
``(x - b_{t-1}) / (b_t - b_{t-1})`` for bin ``t``, 0 above. The edges come from a one-feature
decision tree fitted against the label (:func:`tree_bin_edges`), so a threshold that matters for
fraud ("amount above X") becomes an edge, even when it sits far inside a quantile bin.

PLE is continuous: at an edge it only bends, so "amount > X" would need an ever steeper slope
across the bin above X. Each bin therefore also carries the step ``x > b_{t-1}`` (its lower edge),
which makes a rule on an edge exact: the model reads the same 0 -> 1 jump a tree split makes.

Edges are fitted once on training rows (numpy only, no sklearn: the scorer ships this package)
and stored by the model as a buffer, so scoring applies exactly the edges training used. Edges are
kept in the raw feature's units as float32, the dtype the model sees its inputs in: a split
between two observed values stays strictly between them after the cast.
"""

from __future__ import annotations

import heapq

import numpy as np
import torch
from torch import nn

# Smallest leaf of the edge-fitting tree, as a share of the fitting rows. Leaves thinner than this
# would chase a handful of labels (noise); 0.2% of 100k rows is 200 rows, enough to hold a fraud
# pattern that is rare overall but dense above a threshold.
MIN_LEAF_SHARE = 0.002
MIN_LEAF_ROWS = 20


def tree_bin_edges(values: np.ndarray, labels: np.ndarray, max_bins: int) -> np.ndarray:
    """Bin edges of one feature: the leaves of a best-first Gini tree on ``(values, labels)``.

    Returns sorted float32 edges ``[min, t_1, ..., t_k, max]`` with ``k + 1 <= max_bins`` bins
    (fewer when the feature has fewer distinct values or no split gains); non-finite values are
    ignored; an all-non-finite feature gives an empty array. Each threshold lies in
    ``[below, above)`` of the two neighbouring observed values, so ``x <= t`` separates them.
    Deterministic: the same rows give the same edges on every rank and machine.
    """
    finite = np.isfinite(values)
    v = values[finite].astype(np.float32)
    y = np.asarray(labels, dtype=np.float64)[finite]
    if v.size == 0:
        return np.zeros(0, dtype=np.float32)
    uniq, inverse = np.unique(v, return_inverse=True)
    rows = np.concatenate([[0.0], np.cumsum(np.bincount(inverse, minlength=uniq.size))])
    pos = np.concatenate([[0.0], np.cumsum(np.bincount(inverse, weights=y, minlength=uniq.size))])
    min_leaf = max(MIN_LEAF_ROWS, int(MIN_LEAF_SHARE * v.size))

    def impurity(n: np.ndarray, p: np.ndarray) -> np.ndarray:  # n * Gini / 2, zero for empty nodes
        return np.divide(p * (n - p), n, out=np.zeros_like(n), where=n > 0)

    def best_split(a: int, b: int) -> tuple[float, int, int, int] | None:
        """Best split of the distinct values ``[a, b)`` into ``[a, k)`` and ``[k, b)``."""
        if b - a < 2:
            return None
        k = np.arange(a + 1, b)
        n_left, p_left = rows[k] - rows[a], pos[k] - pos[a]
        n_right, p_right = rows[b] - rows[k], pos[b] - pos[k]
        gain = impurity(np.array([rows[b] - rows[a]]), np.array([pos[b] - pos[a]]))[0] - (
            impurity(n_left, p_left) + impurity(n_right, p_right))
        gain[(n_left < min_leaf) | (n_right < min_leaf)] = -np.inf
        j = int(np.argmax(gain))
        return (-float(gain[j]), a, b, int(k[j])) if gain[j] > 1e-12 else None

    splits: list[int] = []
    heap = [s for s in [best_split(0, uniq.size)] if s is not None]
    while heap and len(splits) + 1 < max_bins:
        _, a, b, k = heapq.heappop(heap)
        splits.append(k)
        for child in (best_split(a, k), best_split(k, b)):
            if child is not None:
                heapq.heappush(heap, child)
    thresholds = [_threshold_between(uniq[k - 1], uniq[k]) for k in sorted(splits)]
    return np.array([uniq[0], *thresholds, uniq[-1]], dtype=np.float32)


def _threshold_between(below: np.float32, above: np.float32) -> np.float32:
    """The midpoint as float32, kept in ``[below, above)`` when rounding would reach ``above``."""
    mid = np.float32((np.float64(below) + np.float64(above)) / 2)
    return mid if below <= mid < above else below


def fit_bin_edges(numeric: np.ndarray, labels: np.ndarray, max_bins: int) -> np.ndarray:
    """``[F, max_bins + 1]`` float32 edges for every column of ``numeric`` (``[n, F]``).

    A feature with fewer bins repeats its last edge: the zero-width bins this pads with encode as 0.
    """
    out = np.zeros((numeric.shape[1], max_bins + 1), dtype=np.float32)
    for j in range(numeric.shape[1]):
        edges = tree_bin_edges(numeric[:, j], labels, max_bins)
        if edges.size:
            out[j, :edges.size] = edges
            out[j, edges.size:] = edges[-1]
    return out


class PiecewiseLinearEncoding(nn.Module):
    """``[B, F]`` finite values -> ``[B, F, 2 * max_bins]``: each bin's PLE fill, then each bin's
    step ``x > lower edge``; every entry in [0, 1].

    Values outside the fitted range saturate (all 0 below the first edge, all 1 above the last);
    the model keeps a standardised copy of every feature for magnitudes beyond the edges. Padding
    (zero-width) bins encode as 0, and before :meth:`set_edges` every bin is padding.
    """

    def __init__(self, num_features: int, max_bins: int) -> None:
        super().__init__()
        self.register_buffer("bin_edges", torch.zeros(num_features, max_bins + 1))

    def set_edges(self, edges: torch.Tensor) -> None:
        if edges.shape != self.bin_edges.shape:
            raise ValueError(f"bin edges of shape {tuple(edges.shape)}, expected {tuple(self.bin_edges.shape)}")
        if not bool((edges[:, 1:] >= edges[:, :-1]).all()):
            raise ValueError("bin edges must be sorted per feature")
        self.bin_edges.copy_(edges)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lower, upper = self.bin_edges[:, :-1], self.bin_edges[:, 1:]
        width = upper - lower
        real = width > 0
        above = x.unsqueeze(-1) - lower
        fill = torch.where(real, (above / torch.where(real, width, torch.ones_like(width))).clamp(0.0, 1.0), 0.0)
        step = (real & (above > 0)).to(x.dtype)
        return torch.cat([fill, step], dim=-1)
