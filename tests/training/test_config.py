from __future__ import annotations

import pytest

from pipeline.config import ConfigError
from pipeline.training.config import load_train_config, train_config_from_dict
from tests.training.dataset_factory import train_config_dict


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_checked_in_configs_load(env):
    config = load_train_config(env)
    assert config.compression.method == "topk_ef"
    assert config.faults.sigkill_rank == -1 and config.faults.nan_loss_at_steps == ()


def test_unknown_keys_and_bad_values_are_named():
    table = train_config_dict()
    table["optim"]["learning_rate"] = 1.0
    with pytest.raises(ConfigError, match="learning_rate"):
        train_config_from_dict(table)
    table = train_config_dict({"compression": {"density": 0.0}})
    with pytest.raises(ConfigError, match="compression.density"):
        train_config_from_dict(table)
    table = train_config_dict({"compression": {"density": 0.01, "density_warmup_start": 0.001}})
    with pytest.raises(ConfigError, match=r"density_warmup_start must be in \[density, 1\]"):
        train_config_from_dict(table)
    table = train_config_dict({"compression": {"method": "zip"}})
    with pytest.raises(ConfigError, match="compression.method"):
        train_config_from_dict(table)


def test_a_sampled_run_takes_its_own_epochs_and_validation_period():
    config = train_config_from_dict(train_config_dict({
        "loop": {"epochs": 10, "validate_every_epochs": 1, "sampled_epochs": 20, "sampled_validate_every_epochs": 2}}))
    assert (config.loop.run_epochs(False), config.loop.validation_period(False)) == (10, 1)
    assert (config.loop.run_epochs(True), config.loop.validation_period(True)) == (20, 2)
    unset = train_config_from_dict(train_config_dict({"loop": {"epochs": 10, "sampled_epochs": 0,
                                                               "sampled_validate_every_epochs": 0}}))
    assert (unset.loop.run_epochs(True), unset.loop.validation_period(True)) == (10, unset.loop.validate_every_epochs)
    with pytest.raises(ConfigError, match="loop.validate_every_epochs"):
        train_config_from_dict(train_config_dict({"loop": {"validate_every_epochs": 0}}))


def test_a_sampled_run_takes_its_own_validation_sample_and_a_bad_rate_is_refused():
    config = train_config_from_dict(train_config_dict({
        "loop": {"validation_negative_rate": 1.0, "sampled_validation_negative_rate": 0.1}}))
    assert (config.loop.validation_sample_rate(False), config.loop.validation_sample_rate(True)) == (1.0, 0.1)
    unset = train_config_from_dict(train_config_dict({
        "loop": {"validation_negative_rate": 0.5, "sampled_validation_negative_rate": 0}}))
    assert unset.loop.validation_sample_rate(True) == 0.5
    with pytest.raises(ConfigError, match=r"loop.validation_negative_rate must be in \(0, 1\]"):
        train_config_from_dict(train_config_dict({"loop": {"validation_negative_rate": 0}}))
    with pytest.raises(ConfigError, match=r"loop.sampled_validation_negative_rate must be in \[0, 1\]"):
        train_config_from_dict(train_config_dict({"loop": {"sampled_validation_negative_rate": 1.5}}))
