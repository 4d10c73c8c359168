"""Which validated epoch's weights a run exports, and when it stops: a pure rule over validation AP.

The trainer asks :func:`judge_validation` after each validation. Validations before ``[loop] min_epochs``
are recorded but neither become the best nor count toward ``early_stop_patience``; the run's last epoch is
always eligible, so a run shorter than ``min_epochs`` still exports validated weights.

A validation split holding fewer than ``[loop] min_validation_frauds`` frauds picks nothing
(:func:`validation_picks`): every validation but the last is ineligible, so the run trains its whole
schedule and exports its last weights."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.training.config import LoopConfig


@dataclass(frozen=True)
class ValidationVerdict:
    eligible: bool  # may pick the exported weights and counts toward patience
    improved: bool  # becomes the best (implies eligible)
    epochs_without_improvement: int  # eligible validations since the best
    stop: bool  # patience is spent


def validation_picks(validation_frauds: int, loop: LoopConfig) -> bool:
    """Whether a validation split holding ``validation_frauds`` frauds may pick the exported epoch and stop
    the run. Below ``loop.min_validation_frauds`` its AP cannot tell epochs apart (conf/prod's comment)."""
    return validation_frauds >= loop.min_validation_frauds


def epoch_picked_by(validation_frauds: int, loop: LoopConfig) -> str:
    """What chose the exported epoch, in the words summary.json records."""
    if not loop.validate:
        return "the schedule's end: validation off"
    if validation_picks(validation_frauds, loop):
        return "validation AP"
    return (f"the schedule's end: validation holds {validation_frauds} frauds, "
            f"fewer than loop.min_validation_frauds {loop.min_validation_frauds}")


def judge_validation(ap: float, epoch: int, is_last: bool, best_ap: float | None,
                     epochs_without_improvement: int, loop: LoopConfig, picks: bool = True) -> ValidationVerdict:
    """The verdict on validation AP ``ap`` after ``epoch`` (0-based). ``best_ap``: the best eligible AP so
    far (None before the first eligible validation; -inf when that one's AP was undefined). A NaN ``ap``
    (no fraud among the validation rows) improves only on no best at all. ``picks``: :func:`validation_picks`
    (False: only the last epoch is eligible)."""
    eligible = is_last or (picks and epoch + 1 >= loop.min_epochs)
    if not eligible:
        return ValidationVerdict(False, False, epochs_without_improvement, False)
    improved = best_ap is None or (not math.isnan(ap) and ap > best_ap + loop.early_stop_min_delta)
    waited = 0 if improved else epochs_without_improvement + 1
    return ValidationVerdict(True, improved, waited, waited >= loop.early_stop_patience)
