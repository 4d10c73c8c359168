"""Pure: population stability of served feature values against the version's training split.

``pipeline.metrics.population_stability_index`` is for probabilities (a fixed log-odds grid); the
features are amounts, counts, rates and codes on scales of their own, so here the bins come from
the reference itself, the usual way:

* numeric: edges at the reference's ``bins``-quantiles (repeated edges merged, so a feature that
  is mostly 0 gets a bin for its 0s); non-finite values get a bin of their own;
* categorical (integer codes): one bin per code among the reference's ``max_categories`` most
  frequent, one for every other code.

PSI = sum_b (c_b - r_b) ln(c_b / r_b), shares floored at ``eps`` so a bin empty on one side stays
finite. Empty input on either side: NaN. Rule of thumb: < 0.1 stable, 0.1-0.25 moving, > 0.25 shifted.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.features import definitions as fd

EPS = 1e-4  # share floor: a bin 1% of one side and empty on the other adds ~0.05, not infinity
MAX_CATEGORIES = 50


def _psi(reference_shares: np.ndarray, current_shares: np.ndarray, eps: float) -> float:
    r = np.clip(reference_shares, eps, None)
    c = np.clip(current_shares, eps, None)
    return float(np.sum((c - r) * np.log(c / r)))


def quantile_edges(reference: np.ndarray, bins: int) -> np.ndarray:
    """Inner bin edges: the reference's ``1/bins .. (bins-1)/bins`` quantiles, repeats merged."""
    finite = reference[np.isfinite(reference)]
    if finite.size == 0:
        return np.empty(0)
    return np.unique(np.quantile(finite, np.linspace(0.0, 1.0, bins + 1)[1:-1]))


def _numeric_shares(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    finite = np.isfinite(values)
    counts = np.bincount(np.searchsorted(edges, values[finite], side="right"), minlength=edges.size + 1)
    counts = np.append(counts, (~finite).sum()).astype(np.float64)
    return counts / values.size


def numeric_psi(reference, current, bins: int = 10, eps: float = EPS) -> float:
    ref = np.asarray(reference, dtype=np.float64).ravel()
    cur = np.asarray(current, dtype=np.float64).ravel()
    if ref.size == 0 or cur.size == 0:
        return float("nan")
    edges = quantile_edges(ref, bins)
    return _psi(_numeric_shares(ref, edges), _numeric_shares(cur, edges), eps)


def categorical_psi(reference, current, max_categories: int = MAX_CATEGORIES, eps: float = EPS) -> float:
    ref = np.asarray(reference).ravel()
    cur = np.asarray(current).ravel()
    if ref.size == 0 or cur.size == 0:
        return float("nan")
    codes, counts = np.unique(ref, return_counts=True)
    kept = codes[np.argsort(-counts, kind="stable")[:max_categories]]

    def shares(values: np.ndarray) -> np.ndarray:
        per_code = np.array([(values == code).sum() for code in kept], dtype=np.float64)
        return np.append(per_code, values.size - per_code.sum()) / values.size

    return _psi(shares(ref), shares(cur), eps)


def feature_psi(reference: dict[str, np.ndarray], current: dict[str, np.ndarray], categorical: set[str],
                bins: int = 10) -> dict[str, float]:
    """PSI per feature present on both sides (``categorical`` names the code features), but those
    constant within a UTC day (:data:`~pipeline.features.definitions.DAY_CONSTANT_FEATURES`): the
    monitor compares one day's payments, on which a weekday is a single value by construction."""
    out = {}
    for name in sorted((set(reference) & set(current)) - set(fd.DAY_CONSTANT_FEATURES)):
        if name in categorical:
            out[name] = categorical_psi(reference[name], current[name])
        else:
            out[name] = numeric_psi(reference[name], current[name], bins)
    return out


STUCK_MARGIN = 0.1  # training's most common value must be this much rarer than the stuck share
MIN_STUCK_ROWS = 200  # fewer served rows: a feature can repeat one value by chance


def top_value_share(values: np.ndarray) -> float:
    """Share of ``values`` taken by the most common one (NaN counts as a value); NaN when empty."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return math.nan
    return float(np.unique(v, return_counts=True, equal_nan=True)[1].max() / v.size)


def stuck_features(reference: dict[str, np.ndarray], current: dict[str, np.ndarray], stuck_share: float) -> tuple[str, ...]:
    """Features stuck at one value in ``current`` (its most common value at least ``stuck_share`` of
    the rows) that varied in ``reference`` (most common value at most ``stuck_share - STUCK_MARGIN``),
    sorted by name; none when ``stuck_share`` is 0 or ``current`` holds fewer than MIN_STUCK_ROWS rows.
    Features constant within a day (:data:`~pipeline.features.definitions.DAY_CONSTANT_FEATURES`) are
    never stuck."""
    names = sorted((set(reference) & set(current)) - set(fd.DAY_CONSTANT_FEATURES))
    if stuck_share <= 0 or not names or len(current[names[0]]) < MIN_STUCK_ROWS:
        return ()
    return tuple(n for n in names if top_value_share(current[n]) >= stuck_share
                 and top_value_share(reference[n]) <= stuck_share - STUCK_MARGIN)
