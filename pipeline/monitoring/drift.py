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
from pipeline.metrics import binomial_at_most

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


RANGE_TAIL = 0.001  # a feature's range: its reference's 0.1% .. 99.9% quantiles (a healthy day leaves it ~0.2%)
SEGMENT_MARK = "@"  # a feature broken within one segment is named "<feature>@<segment>=<code>"
STUCK_MARGIN = 0.1  # training's most common value must be this much rarer than the stuck share
MIN_STUCK_ROWS = 200  # fewer served rows: a feature can repeat one value by chance
# A merchant's features take one value for all its payments in a window, so within a segment the
# independent draws of them are merchants, not payments: a merchant category or a country whose few
# merchants had no recent fraud report shows merchant_fraud_rate_1d "collapsed" to 0 on healthy days
# (the quick default bench: 6 of 7 days; one channel of it too). Not judged within segments (the
# whole-day rule still sees them stuck) until the rule can count merchants.
PER_MERCHANT_FEATURES = frozenset(name(d) for d in fd.MERCHANT_WINDOWS_DAYS
                                  for name in (fd.merchant_count, fd.merchant_fraud_rate))
# Chance collapses allowed a day over every (segment, feature) judged: about one chance alarm in 100
# days, whether one code feature segments the day (~150 judgements) or all of them (~1,500 at full size).
SEGMENT_DAILY_CHANCE = 0.01


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


def value_share(values: np.ndarray, value: float) -> float:
    """Share of ``values`` equal to ``value`` (NaN matches NaN); NaN when empty."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return math.nan
    return float(np.mean(np.isnan(v)) if math.isnan(value) else np.mean(v == value))


def collapsed(reference: np.ndarray, current: np.ndarray, kept: float, chance: float = 1e-4) -> bool:
    """Whether ``current`` lost its variety to one value: the share of values other than its most
    common one is at most ``kept`` times that share in ``reference``, and so far below it that
    chance gives that with probability ``chance`` or less (binomial: a small segment, or a
    feature that is nearly constant in training, needs a clearer collapse). A source stuck, or
    answering a default while it is down, for part of the traffic; at its training mode too, which a
    share of that value alone cannot tell from a busy day."""
    cur = np.asarray(current, dtype=np.float64)
    if cur.size == 0:
        return False
    values, counts = np.unique(cur, return_counts=True, equal_nan=True)
    top = float(values[np.argmax(counts)])
    other_reference = 1.0 - value_share(reference, top)
    other = int(cur.size - counts.max())
    return (other <= kept * other_reference * cur.size
            and binomial_at_most(other, int(cur.size), other_reference) <= chance)


def segment_collapses(reference: dict[str, np.ndarray], current: dict[str, np.ndarray],
                      segments: tuple[str, ...], kept: float) -> tuple[str, ...]:
    """Features broken within one value of a code feature of ``segments`` (one channel, one merchant
    category, one country): their variety collapsed to one value there against the same segment of
    ``reference`` (:func:`collapsed`). An input broken behind one integration path is diluted below any
    whole-day share by the other paths, and a segment code may hold more than one raw value (the
    codes are hashes: atm and contactless share channel code 11), so a break covers part of a
    segment: a collapse, not a share of 99%. Every segment feature is judged because a path's
    payments are one value of more than one of them, and a path that shares its code in one (atm in
    code 11, beside the larger contactless) can be most of its segment in another (ATM withdrawals'
    merchant category).

    Each (segment, feature) judged may collapse by chance with probability SEGMENT_DAILY_CHANCE / the
    number judged that day (Bonferroni), so judging more segments raises no more chance alarms.
    Returns ``"<feature>@<segment>=<code>"`` sorted. A segment value with fewer than MIN_STUCK_ROWS
    rows on either side is not judged (too few to tell a break from chance), nor is a segment's own
    feature, nor are the features constant within a day or a merchant's (:data:`PER_MERCHANT_FEATURES`:
    its payments are not independent draws of them). None when ``kept`` is 0; a segment feature
    missing on either side is not judged."""
    if kept <= 0:
        return ()
    names = sorted((set(reference) & set(current)) - set(fd.DAY_CONSTANT_FEATURES) - PER_MERCHANT_FEATURES)
    judged = []  # (segment, code, its reference rows, its current rows, the features judged there)
    for segment in (s for s in segments if s in reference and s in current):
        ref_codes, cur_codes = np.asarray(reference[segment]), np.asarray(current[segment])
        for code in np.unique(cur_codes):
            ref_rows, cur_rows = ref_codes == code, cur_codes == code
            if ref_rows.sum() >= MIN_STUCK_ROWS and cur_rows.sum() >= MIN_STUCK_ROWS:
                judged.append((segment, code, ref_rows, cur_rows, [n for n in names if n != segment]))
    chance = SEGMENT_DAILY_CHANCE / max(1, sum(len(features) for *_, features in judged))
    found = []
    for segment, code, ref_rows, cur_rows, features in judged:
        found += [f"{n}{SEGMENT_MARK}{segment}={int(code)}" for n in features
                  if collapsed(np.asarray(reference[n])[ref_rows], np.asarray(current[n])[cur_rows], kept, chance)]
    return tuple(sorted(found))


def broken_inputs(reference: dict[str, np.ndarray], current: dict[str, np.ndarray], stuck_share: float,
                  segments: tuple[str, ...] = (), segment_kept: float = 0.0) -> tuple[str, ...]:
    """The served inputs broken on a day: features stuck over the whole day (:func:`stuck_features`),
    then those collapsed to one value within one value of a ``segments`` feature
    (:func:`segment_collapses`). A feature stuck all day is named once, not again for each segment."""
    whole_day = stuck_features(reference, current, stuck_share)
    if not segments or segment_kept <= 0:
        return whole_day
    in_segment = segment_collapses(reference, current, segments, segment_kept)
    return whole_day + tuple(s for s in in_segment if s.split(SEGMENT_MARK, 1)[0] not in whole_day)


def out_of_range_share(reference: np.ndarray, current: np.ndarray, tail: float = RANGE_TAIL) -> float:
    """Share of ``current`` outside ``reference``'s ``tail`` .. ``1 - tail`` quantiles (a non-finite
    value is outside); NaN when either side has no finite value or ``current`` is empty."""
    ref = np.asarray(reference, dtype=np.float64)
    cur = np.asarray(current, dtype=np.float64)
    ref = ref[np.isfinite(ref)]
    if ref.size == 0 or cur.size == 0:
        return math.nan
    low, high = np.quantile(ref, [tail, 1.0 - tail])
    inside = np.isfinite(cur) & (cur >= low) & (cur <= high)
    return float(1.0 - inside.mean())


def out_of_range_features(reference: dict[str, np.ndarray], current: dict[str, np.ndarray], names: tuple[str, ...],
                          max_share: float) -> tuple[str, ...]:
    """Of ``names``, the features with more than ``max_share`` of ``current`` outside ``reference``'s
    range (:func:`out_of_range_share`): amounts in other units, a scale or overflow bug. Sorted;
    none when ``max_share`` is 0 or ``current`` holds fewer than MIN_STUCK_ROWS rows. Meant for the
    payment's own fields: a history count of a growing portfolio leaves its training range by design."""
    present = sorted(set(names) & set(reference) & set(current))
    if max_share <= 0 or not present or len(current[present[0]]) < MIN_STUCK_ROWS:
        return ()
    return tuple(n for n in present if out_of_range_share(reference[n], current[n]) > max_share)
