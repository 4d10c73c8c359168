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
