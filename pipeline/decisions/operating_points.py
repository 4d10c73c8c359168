"""Operating points: the score thresholds of a model version's decisions, chosen from a budget.

The risk team works to a capacity, not to a probability: ``review_rate`` is the share of payments
the score may flag (send to review or block), the Handbook's "k alerts a day" as a share. Blocking
is the stricter action inside that share: the lowest threshold whose blocked payments reach
``block_precision`` (a decline the customer did not deserve is the costly error), or, when that
target is off or the data cannot reach it, the top ``block_rate`` share.

Thresholds are chosen on the version's own validation scores when its run is finalised
(:func:`choose_operating_points`), travel with the model (``operating_points.json`` in the model
directory, ``operating_points.*`` tags on the MLflow version) and are what the scoring service
decides with. So a new champion with a different score distribution keeps the review volume near
the budget, where fixed probability thresholds would move it with every swap.

Definitions used everywhere (serving's rates, the gate, the monitor, the bench):

* flagged: score >= ``review_threshold`` (sent to review, or blocked when also >= ``block_threshold``);
* review rate: the share of scored payments flagged; block rate: the share >= ``block_threshold``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pipeline.atomic import atomic_path
from pipeline.config import ConfigError
from pipeline.jsonable import nan_to_none

OPERATING_POINTS_FILE = "operating_points.json"  # in the model directory, beside the weights
TAG_PREFIX = "operating_points."
BlockRule = Literal["precision", "rate", "rate_fallback", "explicit"]


@dataclass(frozen=True)
class DecisionBudget:
    """``[decisions]`` of train.toml: what the thresholds are chosen from when a run is finalised."""

    review_rate: float = 0.005  # share of payments the score may flag (review + block): the team's capacity
    block_precision: float = 0.9  # block from the lowest threshold whose blocked share is this precise; 0: use block_rate
    block_rate: float = 0.0005  # share blocked when block_precision is 0 or unreachable on validation
    min_block_frauds: int = 5  # a precision judged on fewer frauds above the threshold is noise

    def __post_init__(self) -> None:
        problems = []
        if not 0.0 < self.review_rate < 1.0:
            problems.append(f"decisions.review_rate must be in (0, 1), got {self.review_rate}")
        if not 0.0 < self.block_rate < 1.0:
            problems.append(f"decisions.block_rate must be in (0, 1), got {self.block_rate}")
        elif self.block_rate > self.review_rate:
            problems.append(f"decisions.block_rate ({self.block_rate}) must not exceed decisions.review_rate "
                            f"({self.review_rate}): blocked payments are part of the flagged share")
        if not 0.0 <= self.block_precision <= 1.0:
            problems.append(f"decisions.block_precision must be in [0, 1] (0: block the top block_rate), "
                            f"got {self.block_precision}")
        if self.min_block_frauds < 1:
            problems.append(f"decisions.min_block_frauds must be >= 1, got {self.min_block_frauds}")
        if problems:
            raise ConfigError("; ".join(problems))


@dataclass(frozen=True)
class SplitFigures:
    """What the thresholds realise on the rows they were chosen (or checked) on."""

    rows: int
    frauds: int
    review_rate: float  # flagged share
    block_rate: float
    recall: float  # frauds flagged / frauds (NaN without frauds)
    precision: float  # frauds among the flagged (NaN when none flagged)
    block_precision: float
    # The mean score: for a version's calibrated validation scores, the fraud rate they are calibrated
    # at (the source prior of pipeline.decisions.prior_tracking); NaN in records written before it.
    mean_score: float = math.nan


@dataclass(frozen=True)
class OperatingPoints:
    """A version's thresholds, how they were chosen, and what they realised on validation."""

    review_threshold: float
    block_threshold: float
    block_rule: BlockRule
    budget: DecisionBudget | None  # None: explicit thresholds (an override, not a budget)
    validation: SplitFigures | None = None
    notes: tuple[str, ...] = ()  # e.g. why the precision target fell back to the rate
    chosen_on: str = "validation"

    def __post_init__(self) -> None:
        if not 0.0 <= self.review_threshold <= self.block_threshold <= 1.0:
            raise ValueError(f"operating points need 0 <= review_threshold <= block_threshold <= 1, "
                             f"got {self.review_threshold}, {self.block_threshold}")

    @property
    def review_budget(self) -> float | None:
        return None if self.budget is None else self.budget.review_rate

    def to_dict(self) -> dict[str, Any]:
        return nan_to_none(asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> OperatingPoints:
        budget = DecisionBudget(**d["budget"]) if d.get("budget") else None
        validation = d.get("validation")
        figures = SplitFigures(**{k: math.nan if v is None else v for k, v in validation.items()}) if validation else None
        return OperatingPoints(float(d["review_threshold"]), float(d["block_threshold"]), d["block_rule"], budget,
                               figures, tuple(d.get("notes", ())), d.get("chosen_on", "validation"))

    @staticmethod
    def from_json(text: str) -> OperatingPoints:
        return OperatingPoints.from_dict(json.loads(text))

    def tags(self) -> dict[str, str]:
        """MLflow model-version tags: the thresholds, the budget and the validation figures."""
        tags = {f"{TAG_PREFIX}review_threshold": repr(self.review_threshold),
                f"{TAG_PREFIX}block_threshold": repr(self.block_threshold),
                f"{TAG_PREFIX}block_rule": self.block_rule, f"{TAG_PREFIX}chosen_on": self.chosen_on}
        if self.budget is not None:
            tags |= {f"{TAG_PREFIX}budget.{k}": repr(v) for k, v in asdict(self.budget).items()}
        if self.validation is not None:
            tags |= {f"{TAG_PREFIX}validation.{k}": f"{v:.6g}" for k, v in asdict(self.validation).items()}
        if self.notes:
            tags[f"{TAG_PREFIX}notes"] = "; ".join(self.notes)[:5000]
        return tags | {JSON_TAG: json.dumps(self.to_dict(), sort_keys=True)}

    def describe(self) -> str:
        """``review >= 0.0213 (top 0.50%), block >= 0.412 (precision 0.90 on validation)``."""
        if self.budget is None:
            return f"review >= {self.review_threshold:.4g}, block >= {self.block_threshold:.4g} (explicit thresholds)"
        block = {"precision": f"precision target {self.budget.block_precision:g}",
                 "rate": f"top {self.budget.block_rate:.2%}",
                 "rate_fallback": f"top {self.budget.block_rate:.2%}, precision target unreachable"}[self.block_rule]
        return (f"review >= {self.review_threshold:.4g} (budget: top {self.budget.review_rate:.2%} of payments), "
                f"block >= {self.block_threshold:.4g} ({block})")


def explicit_operating_points(review_threshold: float, block_threshold: float, reason: str) -> OperatingPoints:
    """Thresholds given by hand (an override): no budget, the reason kept in the notes."""
    return OperatingPoints(review_threshold, block_threshold, "explicit", None, notes=(reason,), chosen_on="config")


def _descending(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-scores, kind="mergesort")
    return labels[order].astype(np.int64), scores[order]


def rank_for_rate(n: int, rate: float) -> int:
    """How many of ``n`` rows flagging the top ``rate`` share flags: ``ceil(rate * n)``, at least 1."""
    return min(n, max(1, math.ceil(rate * n - 1e-9)))


def threshold_for_rate(sorted_scores: np.ndarray, rate: float) -> float:
    """The score of the ``ceil(rate * n)``-th highest row (``sorted_scores`` descending): flagging at or
    above it flags that share (more where scores tie at the threshold)."""
    return float(sorted_scores[rank_for_rate(sorted_scores.size, rate) - 1])


def threshold_for_precision(sorted_labels: np.ndarray, sorted_scores: np.ndarray, target: float,
                            min_frauds: int) -> tuple[float | None, float]:
    """The lowest threshold whose flagged rows (score >= it) hold at least ``min_frauds`` frauds at a
    precision >= ``target``; None when none does. Also the best precision seen with ``min_frauds``."""
    last_of_tie = np.r_[sorted_scores[1:] != sorted_scores[:-1], True]  # a threshold flags whole tie groups
    tp = np.cumsum(sorted_labels)[last_of_tie]
    flagged = np.flatnonzero(last_of_tie) + 1
    precision = tp / flagged
    enough = tp >= min_frauds
    best = float(precision[enough].max()) if enough.any() else math.nan
    ok = np.flatnonzero(enough & (precision >= target))
    if ok.size == 0:
        return None, best
    return float(sorted_scores[flagged[ok[-1]] - 1]), best


def split_figures(labels, scores, review_threshold: float, block_threshold: float) -> SplitFigures:
    """What thresholds realise on rows ``labels``/``scores`` (NaN scores never flag)."""
    y = np.asarray(labels, dtype=np.int64).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    flagged, blocked = s >= review_threshold, s >= block_threshold
    frauds = int(y.sum())
    nan = math.nan
    return SplitFigures(
        rows=int(y.size), frauds=frauds,
        review_rate=float(flagged.mean()) if y.size else nan, block_rate=float(blocked.mean()) if y.size else nan,
        recall=float(y[flagged].sum() / frauds) if frauds else nan,
        precision=float(y[flagged].mean()) if flagged.any() else nan,
        block_precision=float(y[blocked].mean()) if blocked.any() else nan,
        mean_score=float(np.nanmean(s)) if np.isfinite(s).any() else nan)


def choose_operating_points(labels, scores, budget: DecisionBudget, chosen_on: str = "validation") -> OperatingPoints:
    """Thresholds realising ``budget`` on these rows (a version's validation split).

    Block: the precision target when set and reachable with ``min_block_frauds`` frauds, else the top
    ``block_rate`` (recorded in ``block_rule`` and the notes). Review: the top ``review_rate``. The block
    threshold is never below the review threshold (blocked payments are part of the flagged share).
    Raises ValueError for rows without a finite score.
    """
    y = np.asarray(labels, dtype=np.int64).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    finite = np.isfinite(s)
    if not finite.any():
        raise ValueError(f"no finite {chosen_on} scores to choose the operating points on")
    sorted_labels, sorted_scores = _descending(y[finite], s[finite])
    review = threshold_for_rate(sorted_scores, budget.review_rate)
    notes: list[str] = []
    rule: BlockRule = "rate"
    block = None
    if budget.block_precision > 0:
        block, best = threshold_for_precision(sorted_labels, sorted_scores, budget.block_precision,
                                              budget.min_block_frauds)
        if block is None:
            seen = "no threshold holds that many" if math.isnan(best) else f"the best reached is {best:.3f}"
            notes.append(f"block_precision {budget.block_precision:g} is not reachable on {chosen_on} with at least "
                         f"{budget.min_block_frauds} frauds blocked ({seen}): blocking the top "
                         f"{budget.block_rate:.2%} instead")
            rule = "rate_fallback"
        else:
            rule = "precision"
    if block is None:
        block = threshold_for_rate(sorted_scores, budget.block_rate)
    if block < review:
        notes.append(f"the block threshold {block:.4g} was below the review threshold {review:.4g}: "
                     "raised to it (every flagged payment is blocked)")
        block = review
    return OperatingPoints(review, block, rule, budget, split_figures(y, s, review, block), tuple(notes), chosen_on)


# -- where a version keeps them -------------------------------------------------------------------
JSON_TAG = f"{TAG_PREFIX}json"  # the whole record on the MLflow version (the flat tags are for people)
# Written by the gate on the challenger: recall on its holdout at its own thresholds, the expectation
# the live-model monitor judges the version's realised recall against.
EXPECTED_RECALL_TAG = "gate.expected_recall"


def write_operating_points(model_dir: Path, points: OperatingPoints) -> Path:
    """``model_dir/operating_points.json``, atomically (it ships with the weights in the model package)."""
    with atomic_path(Path(model_dir) / OPERATING_POINTS_FILE) as tmp:
        tmp.write_text(points.to_json())
    return Path(model_dir) / OPERATING_POINTS_FILE


def read_operating_points(model_dir: Path) -> OperatingPoints | None:
    """The operating points shipped in ``model_dir``; None for a model packaged before they existed.
    Raises ValueError when the file is there but unreadable (a corrupt package is not "no thresholds")."""
    path = Path(model_dir) / OPERATING_POINTS_FILE
    if not path.is_file():
        return None
    try:
        return OperatingPoints.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a valid operating-points record ({type(exc).__name__}: {exc})") from exc


def operating_points_from_tags(tags: dict[str, str]) -> OperatingPoints | None:
    """A registered version's operating points from its tags; None when it has none."""
    text = tags.get(JSON_TAG)
    return OperatingPoints.from_json(text) if text else None
