"""Which validated epoch's weights a run exports, and when it stops: a pure rule over validation AP.

The trainer asks :func:`judge_validation` after each validation. Validations before ``[loop] min_epochs``
are recorded but neither become the best nor count toward ``early_stop_patience``; the run's last epoch is
always eligible, so a run shorter than ``min_epochs`` still exports validated weights."""

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


def judge_validation(ap: float, epoch: int, is_last: bool, best_ap: float | None,
                     epochs_without_improvement: int, loop: LoopConfig) -> ValidationVerdict:
    """The verdict on validation AP ``ap`` after ``epoch`` (0-based). ``best_ap``: the best eligible AP so
    far (None before the first eligible validation; -inf when that one's AP was undefined). A NaN ``ap``
    (no fraud among the validation rows) improves only on no best at all."""
    eligible = epoch + 1 >= loop.min_epochs or is_last
    if not eligible:
        return ValidationVerdict(False, False, epochs_without_improvement, False)
    improved = best_ap is None or (not math.isnan(ap) and ap > best_ap + loop.early_stop_min_delta)
    waited = 0 if improved else epochs_without_improvement + 1
    return ValidationVerdict(True, improved, waited, waited >= loop.early_stop_patience)
