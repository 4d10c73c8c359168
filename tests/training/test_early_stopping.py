"""The pick-and-stop rule over validation AP (pipeline/training/early_stopping.py), replayed over AP curves."""

import math

import pytest

from pipeline.config import ConfigError
from pipeline.training.config import LoopConfig, derive_train_config, train_config_from_dict
from pipeline.training.early_stopping import judge_validation


def _replay(aps: list[float], loop: LoopConfig) -> tuple[int, int]:
    """(best epoch, epochs run) of a run validating after every epoch with these APs, as the trainer does."""
    best_ap, best_epoch, waited = None, -1, 0
    for epoch, ap in enumerate(aps):
        verdict = judge_validation(ap, epoch, epoch == len(aps) - 1, best_ap, waited, loop)
        if verdict.improved:
            best_ap, best_epoch = (-math.inf if math.isnan(ap) else ap), epoch
        waited = verdict.epochs_without_improvement
        if verdict.stop:
            return best_epoch, epoch + 1
    return best_epoch, len(aps)


# A short-layout curve: the noisy first epoch beats the next three, later epochs beat it.
CURVE = [0.30, 0.25, 0.26, 0.27, 0.29, 0.32, 0.31, 0.30, 0.29, 0.28]


def test_without_min_epochs_an_early_winner_stops_the_run_and_is_exported():
    assert _replay(CURVE, LoopConfig(early_stop_patience=3, min_epochs=1)) == (0, 4)


def test_min_epochs_skips_the_early_winner_and_counts_patience_from_there():
    # Eligible from epoch 3 (the 4th): best 0.32 at epoch 5, then 3 flat validations stop it after epoch 8.
    assert _replay(CURVE, LoopConfig(early_stop_patience=3, min_epochs=4)) == (5, 9)


def test_a_run_shorter_than_min_epochs_still_exports_its_last_validated_epoch():
    assert _replay([0.5, 0.4], LoopConfig(early_stop_patience=1, min_epochs=4)) == (1, 2)


def test_a_gain_below_min_delta_is_not_an_improvement_and_nan_never_beats_a_best():
    loop = LoopConfig(early_stop_patience=2, early_stop_min_delta=0.01, min_epochs=1)
    assert _replay([0.30, 0.305, float("nan"), 0.5], loop) == (0, 3)
    assert _replay([float("nan"), 0.1], loop) == (1, 2)  # an undefined first AP is replaced by any real one


def test_min_epochs_below_one_is_refused_and_the_checked_in_configs_set_it():
    table = derive_train_config("dev", {"loop": {"min_epochs": 0}})
    with pytest.raises(ConfigError, match="loop.min_epochs must be >= 1"):
        train_config_from_dict(table)
    for env in ("dev", "prod"):
        assert train_config_from_dict(derive_train_config(env)).loop.min_epochs > 1
