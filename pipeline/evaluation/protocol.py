"""The evaluation protocol: how a fraud model is measured here, the way fraud teams measure it.

Two pure parts, no I/O:

* **Backtest layout** (:func:`plan_backtest`): training rows up to day ``D`` with labels as known at
  the end of ``D + G`` (G = label maturity: by then every training row's label is final), a gap of
  ``G`` days that neither side uses (the model would be trained at ``D + G`` and score only what
  follows), then test rows whose labels are fully matured (known ``G`` days after the last test day).
* **Evaluation** (:func:`evaluate_protocol`): one scored test frame in, one :class:`ProtocolReport`
  out. Rows of cards already *known compromised* are removed per test day (an investigator has
  blocked those cards already: catching them again is worth nothing); on the remaining rows come
  daily card precision@k (cards detected on earlier days excluded), AUC, AP, recall at 1% FPR, ECE
  (from :mod:`pipeline.metrics`) and, where the simulator's truth is attached, recall per pattern.

Card precision@k, the standard definition (Dal Pozzolo et al.; Le Borgne et al., *Reproducible
machine learning for credit card fraud detection*): per test day, each card's score is its highest
transaction score that day, a card is fraudulent that day if any of its transactions that day is
labelled fraud, and the share of fraudulent cards among the ``k`` highest-scored cards is taken,
divided by ``k`` even when the day has fewer than ``k`` cards (investigators have ``k`` slots a day;
an unused slot is not a hit). Cards found fraudulent in an earlier day's top ``k`` are blocked and
left out of later days. The result is the mean over test days.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from datetime import date, timedelta
from typing import Any

import numpy as np
import pandas as pd

from pipeline.datasets.manifest import REPORTED_AT_COLUMN, DateWindow
from pipeline.metrics import (
    DayCardPrecision,
    auc_roc,
    average_precision,
    daily_card_precision,
    expected_calibration_error,
    recall_at_fpr,
)
from pipeline.simulation.config import GENUINE

REQUIRED_COLUMNS = ("transaction_id", "card_id", "event_time", "score", "label")
REPORTED_COLUMN = REPORTED_AT_COLUMN  # optional: when the fraud was reported (NaT: no report)
PATTERN_COLUMN = "fraud_pattern"  # optional: the simulator's truth tag (its ``pattern``), null or ``genuine`` if none
MAX_FPR = 0.01  # recall at 1% FPR: roughly the share of genuine payments a bank tolerates declining
PATTERN_TOP_SHARE = 0.01  # per-pattern recall counts a fraud as caught when it is in the top 1% of scores
DEFAULT_K = 100  # cards a team of investigators can review in a day
_NS_PER_DAY = 86_400 * 10**9
_NEVER = np.iinfo(np.int64).max  # "known compromised at" for cards with no known fraud


class ProtocolError(ValueError):
    """Inputs the protocol cannot evaluate or plan; the message names what to fix."""


# ---------------------------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class BacktestDays:
    """Day counts of a backtest layout; ``gap`` is the label maturity period G."""

    train: int
    validation: int
    gap: int
    test: int

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ProtocolError(f"backtest {f.name} days must be a whole number >= 1, got {value!r}")


@dataclass(frozen=True)
class BacktestLayout:
    """Four consecutive inclusive windows, oldest first: train, validation, gap, test.

    Construction checks that every window is non-empty and that each starts the day after the
    previous one ends (no overlap, no hole), so a layout read back from elsewhere (a manifest, a
    command line) is as sound as one from :func:`plan_backtest`.
    """

    train: DateWindow
    validation: DateWindow
    gap: DateWindow
    test: DateWindow

    def __post_init__(self) -> None:
        previous: tuple[str, date] | None = None
        for name, window in self.windows().items():
            start, end = _day(window.start, name), _day(window.end, name)
            if end < start:
                raise ProtocolError(f"backtest {name} window {window.start}..{window.end} ends before it starts")
            if previous is not None:
                prev_name, prev_end = previous
                if start <= prev_end:
                    raise ProtocolError(f"backtest {name} window starts {start}, inside the {prev_name} window "
                                        f"(ends {prev_end}): windows must not overlap")
                if start != prev_end + timedelta(days=1):
                    raise ProtocolError(f"backtest {name} window starts {start}, not the day after the {prev_name} "
                                        f"window ends ({prev_end}): the days in between would be silently unused")
            previous = (name, end)

    def windows(self) -> dict[str, DateWindow]:
        """All four windows, oldest first."""
        return {"train": self.train, "validation": self.validation, "gap": self.gap, "test": self.test}

    def splits(self) -> dict[str, DateWindow]:
        """The windows that hold rows, shaped like ``DatasetPlan.splits`` (the gap holds none)."""
        return {"train": self.train, "validation": self.validation, "test": self.test}

    @property
    def gap_days(self) -> int:
        return (date.fromisoformat(self.gap.end) - date.fromisoformat(self.gap.start)).days + 1

    @property
    def train_label_cutoff(self) -> date:
        """``D + G``: train and validation labels are those reported by the end of this day."""
        return date.fromisoformat(self.gap.end)

    @property
    def test_label_cutoff(self) -> date:
        """Last test day + G: test labels are those reported by the end of this day (fully matured)."""
        return date.fromisoformat(self.test.end) + timedelta(days=self.gap_days)


def plan_backtest(test_end: date, days: BacktestDays) -> BacktestLayout:
    """The layout whose last test day is ``test_end``, counted backwards by ``days``.

    A nightly build on run date ``R`` passes ``test_end = R - G``; its test labels are then final on
    ``R`` itself (``layout.test_label_cutoff == R``).
    """
    test_start = test_end - timedelta(days=days.test - 1)
    gap_start = test_start - timedelta(days=days.gap)
    validation_start = gap_start - timedelta(days=days.validation)
    train_start = validation_start - timedelta(days=days.train)
    one = timedelta(days=1)
    return BacktestLayout(
        train=_window(train_start, validation_start - one),
        validation=_window(validation_start, gap_start - one),
        gap=_window(gap_start, test_start - one),
        test=_window(test_start, test_end),
    )


def _window(start: date, end: date) -> DateWindow:
    return DateWindow(start.isoformat(), end.isoformat())


def _day(text: str, name: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError as exc:
        raise ProtocolError(f"backtest {name} window has {text!r}, not a YYYY-MM-DD date") from exc


# ------------------------------------------------------------------------------------------ evaluation


@dataclass(frozen=True)
class ProtocolReport:
    """Every number of the protocol for one scored test window (see the module docstring)."""

    k: int
    card_precision_at_k: float  # mean of ``days[i].precision``; NaN without a test day
    days: tuple[DayCardPrecision, ...]
    auc_roc: float
    average_precision: float
    recall_at_1pct_fpr: float
    ece: float
    n: int  # evaluated rows (known-compromised rows removed)
    n_fraud: int
    n_known_removed: int  # rows removed because their card was known compromised that day
    pattern_recall: dict[str, float]  # pattern -> share of its frauds in the top 1% of scores
    pattern_frauds: dict[str, int]  # pattern -> its fraud rows among the evaluated rows

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: scalars first, card precision keyed ``card_precision_at_<k>``."""
        return {
            f"card_precision_at_{self.k}": self.card_precision_at_k, "k": self.k,
            "auc_roc": self.auc_roc, "average_precision": self.average_precision,
            "recall_at_1pct_fpr": self.recall_at_1pct_fpr, "ece": self.ece,
            "n": self.n, "n_fraud": self.n_fraud, "n_known_removed": self.n_known_removed,
            "pattern_recall": dict(self.pattern_recall), "pattern_frauds": dict(self.pattern_frauds),
            "days": [asdict(d) for d in self.days],
        }


def evaluate_protocol(frame: pd.DataFrame, *, label_delay: timedelta, known_compromised: Iterable[str] = (),
                      prior_reports: pd.DataFrame | None = None, k: int = DEFAULT_K) -> ProtocolReport:
    """Evaluate one scored test window.

    ``frame``: one row per test transaction with :data:`REQUIRED_COLUMNS` (``event_time`` UTC,
    ``score`` finite, ``label`` 0/1 as matured), optionally :data:`REPORTED_COLUMN` and
    :data:`PATTERN_COLUMN`. A card is known compromised on test day ``t`` when it is in
    ``known_compromised`` (cards with a fraud in the training period), or when one of its frauds
    -- a ``label == 1`` row of ``frame``, or a row of ``prior_reports`` (``card_id``, ``reported_at``:
    frauds from before the window, e.g. the gap) -- was reported with ``reported_at + label_delay``
    before ``t`` starts. Raises :class:`ProtocolError` on unusable input; never mutates ``frame``.
    """
    if not isinstance(k, int) or k < 1:
        raise ProtocolError(f"k must be a whole number >= 1, got {k!r}")
    delay_ns = pd.Timedelta(label_delay).value
    if delay_ns < 0:
        raise ProtocolError(f"label_delay must not be negative, got {label_delay}")
    card_ids, cards, day, scores, labels = _columns(frame)
    known = _known_rows(frame, card_ids, cards, day, labels, delay_ns, known_compromised, prior_reports)
    daily = daily_card_precision(day, cards, scores, labels, known, k)
    kept = ~known
    y, s = labels[kept], scores[kept]
    patterns = frame[PATTERN_COLUMN].to_numpy(dtype=object)[kept] if PATTERN_COLUMN in frame else None
    recall, frauds = pattern_recall(patterns, s) if patterns is not None else ({}, {})
    return ProtocolReport(
        k=k, card_precision_at_k=float(np.mean([d.precision for d in daily])) if daily else float("nan"),
        days=daily, auc_roc=auc_roc(y, s), average_precision=average_precision(y, s),
        recall_at_1pct_fpr=recall_at_fpr(y, s, MAX_FPR), ece=expected_calibration_error(y, s),
        n=int(y.size), n_fraud=int(y.sum()), n_known_removed=int(known.sum()),
        pattern_recall=recall, pattern_frauds=frauds,
    )


def known_compromised_rows(frame: pd.DataFrame, *, label_delay: timedelta, known_compromised: Iterable[str] = (),
                           prior_reports: pd.DataFrame | None = None) -> np.ndarray:
    """Which rows belong to a card already known compromised on the row's day (the rule of
    :func:`evaluate_protocol`), for callers that drop them before their own scoring (the gate).

    ``frame`` needs ``card_id``, ``event_time``, ``label`` and optionally :data:`REPORTED_COLUMN`.
    """
    unscored = frame.assign(score=0.0) if "score" not in frame.columns else frame
    card_ids, cards, day, _, labels = _columns(unscored)
    return _known_rows(unscored, card_ids, cards, day, labels, pd.Timedelta(label_delay).value, known_compromised,
                       prior_reports)


def _known_rows(frame: pd.DataFrame, card_ids: pd.Index, cards: np.ndarray, day: np.ndarray, labels: np.ndarray,
                delay_ns: int, known_compromised: Iterable[str], prior_reports: pd.DataFrame | None) -> np.ndarray:
    known_at = _known_compromised_at(frame, card_ids, cards, labels, delay_ns, known_compromised, prior_reports)
    return known_at[cards] < day * _NS_PER_DAY


def pattern_recall(patterns: np.ndarray, scores: np.ndarray,
                   top_share: float = PATTERN_TOP_SHARE) -> tuple[dict[str, float], dict[str, int]]:
    """Per pattern tag: the share of its rows in the top ``top_share`` of ``scores``, and its row count.

    Rows tagged null or ``genuine`` belong to no pattern. The top holds ``ceil(top_share * n)`` rows;
    rows tied with the lowest score admitted share the remaining places equally (each counts as the
    fraction of a catch random tie-breaking would give), so a constant scorer gets ``top_share``.
    """
    tags = pd.Series(patterns, dtype=object)
    is_pattern = tags.notna().to_numpy() & (tags != GENUINE).to_numpy()
    if not is_pattern.any():
        return {}, {}
    caught = pd.Series(_top_share_weights(scores, top_share)[is_pattern]).groupby(tags[is_pattern].to_numpy())
    recall = caught.mean()
    counts = caught.size()
    return ({str(p): float(recall[p]) for p in sorted(recall.index)},
            {str(p): int(counts[p]) for p in sorted(counts.index)})


def _top_share_weights(scores: np.ndarray, share: float) -> np.ndarray:
    """1 for rows strictly inside the top ``ceil(share * n)``, the tied remainder's share at its border."""
    n = scores.size
    places = max(1, math.ceil(round(share * n, 9)))  # round: 0.01 * 300 is 3.0000000000000004
    border = np.partition(scores, n - places)[n - places]
    above, tied = scores > border, scores == border
    weights = above.astype(np.float64)
    weights[tied] = (places - int(above.sum())) / int(tied.sum())
    return weights


def _columns(frame: pd.DataFrame) -> tuple[pd.Index, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Checked arrays: distinct card ids (sorted), each row's card code, UTC day number, score, label."""
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ProtocolError(f"the scored frame lacks column(s) {missing}; it needs {list(REQUIRED_COLUMNS)}")
    scores = frame["score"].to_numpy(dtype=np.float64)
    if not np.isfinite(scores).all():
        raise ProtocolError(f"{int((~np.isfinite(scores)).sum())} scores are NaN or infinite: evaluate the rows "
                            "with finite scores and report the rest apart (the gate's NaN guardrail does)")
    labels = frame["label"].to_numpy()
    if not np.isin(labels, (0, 1)).all():
        raise ProtocolError("label must be 0 or 1 in every row")
    event_ns = _utc_ns(frame["event_time"], "event_time")
    if (event_ns == np.iinfo(np.int64).min).any():
        raise ProtocolError("event_time is missing in some rows")
    codes, card_ids = pd.factorize(frame["card_id"], sort=True)
    return pd.Index(card_ids), codes.astype(np.int64), event_ns // _NS_PER_DAY, scores, labels.astype(np.int64)


def _known_compromised_at(frame: pd.DataFrame, card_ids: pd.Index, cards: np.ndarray, labels: np.ndarray,
                          delay_ns: int, known_compromised: Iterable[str],
                          prior_reports: pd.DataFrame | None) -> np.ndarray:
    """Per card code: the instant (UTC ns) from which the card counts as known compromised."""
    known_at = np.full(len(card_ids), _NEVER, dtype=np.int64)
    report_cards, report_ns = [], []
    if REPORTED_COLUMN in frame.columns:
        fraud = labels == 1
        report_cards.append(cards[fraud])
        report_ns.append(_utc_ns(frame[REPORTED_COLUMN], REPORTED_COLUMN)[fraud])
    if prior_reports is not None:
        report_cards.append(card_ids.get_indexer(prior_reports["card_id"]))
        report_ns.append(_utc_ns(prior_reports["reported_at"], "prior_reports.reported_at"))
    if report_cards:
        code, ns = np.concatenate(report_cards), np.concatenate(report_ns)
        usable = (code >= 0) & (ns != np.iinfo(np.int64).min)  # a card outside the window, or no report
        np.minimum.at(known_at, code[usable], ns[usable] + delay_ns)
    training = card_ids.get_indexer(pd.Index(list(known_compromised)))
    known_at[training[training >= 0]] = np.iinfo(np.int64).min  # known since before the first test day
    return known_at


def _utc_ns(values: pd.Series, name: str) -> np.ndarray:
    """Epoch nanoseconds (UTC) of a datetime column, naive values taken as UTC; NaT -> int64 min."""
    try:
        return pd.DatetimeIndex(pd.to_datetime(values, utc=True)).as_unit("ns").asi8
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"{name} is not a datetime column ({exc})") from exc
