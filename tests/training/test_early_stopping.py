"""The pick-and-stop rule over validation AP (pipeline/training/early_stopping.py), replayed over AP curves."""

import math

import pytest

from pipeline.bench.train import BENCH_EPOCH_RULE
from pipeline.config import ConfigError
from pipeline.training.config import LoopConfig, derive_train_config, train_config_from_dict
from pipeline.training.early_stopping import epoch_picked_by, judge_validation, validation_picks


def _replay(aps: list[float], loop: LoopConfig, picks: bool = True) -> tuple[int, int]:
    """(best epoch, epochs run) of a run validating after every epoch with these APs, as the trainer does."""
    best_ap, best_epoch, waited = None, -1, 0
    for epoch, ap in enumerate(aps):
        verdict = judge_validation(ap, epoch, epoch == len(aps) - 1, best_ap, waited, loop, picks)
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


def test_a_validation_with_too_few_frauds_picks_nothing_and_the_whole_schedule_runs():
    loop = LoopConfig(early_stop_patience=3, min_epochs=4, min_validation_frauds=200)
    assert not validation_picks(199, loop) and validation_picks(200, loop)
    # The same curve that stops after epoch 8 with epoch 5 picked runs all 10 and exports the last,
    # though the last has the curve's third-lowest AP.
    assert _replay(CURVE, loop, picks=False) == (9, 10)
    assert _replay([0.5, 0.1], LoopConfig(early_stop_patience=1, min_epochs=1), picks=False) == (1, 2)
    assert epoch_picked_by(250, loop) == "validation AP"
    assert epoch_picked_by(110, loop) == ("the schedule's end: validation holds 110 frauds, "
                                          "fewer than loop.min_validation_frauds 200")


def test_validation_always_picks_by_default_and_a_negative_threshold_is_refused():
    assert validation_picks(0, LoopConfig())
    with pytest.raises(ConfigError, match="loop.min_validation_frauds must be >= 0"):
        train_config_from_dict(derive_train_config("dev", {"loop": {"min_validation_frauds": -1}}))


def test_prod_lets_only_a_validation_of_200_frauds_pick_and_the_baseline_bench_trains_by_prod_s_rule():
    prod = train_config_from_dict(derive_train_config("prod")).loop
    assert prod.min_validation_frauds == 200
    assert BENCH_EPOCH_RULE == {"min_validation_frauds": prod.min_validation_frauds}
