"""Simulation presets: the default portfolio and named others next to it, chosen by name or env var."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config import ConfigError
from pipeline.simulation import SimulationConfig, load_simulation_config
from pipeline.simulation.config import PRESET_ENV_VAR


def test_the_ecommerce_preset_is_another_portfolio() -> None:
    default, ecommerce = load_simulation_config("dev"), load_simulation_config("dev", "ecommerce")
    assert ecommerce.seed != default.seed
    assert ecommerce.pattern_mix != default.pattern_mix
    assert ecommerce.population.online_share > default.population.online_share


def test_the_preset_env_var_selects_a_preset_and_an_argument_wins(monkeypatch) -> None:
    monkeypatch.setenv(PRESET_ENV_VAR, "ecommerce")
    assert load_simulation_config("dev") == load_simulation_config("dev", "ecommerce")
    monkeypatch.setenv(PRESET_ENV_VAR, "")
    assert load_simulation_config("dev") == load_simulation_config("dev", None)


def test_an_unknown_preset_names_the_ones_there_are() -> None:
    with pytest.raises(ConfigError, match="presets there: ecommerce"):
        load_simulation_config("dev", "nosuch")
    with pytest.raises(ConfigError, match="lower-case"):
        load_simulation_config("dev", "../prod/simulation")


def test_bad_nested_values_are_named() -> None:
    base = SimulationConfig()
    with pytest.raises(ConfigError, match="population.online_share"):
        dataclasses.replace(base, population=dataclasses.replace(base.population, online_share=1.0))
    with pytest.raises(ConfigError, match="fraud_shapes.campaign_days"):
        dataclasses.replace(base, fraud_shapes=dataclasses.replace(base.fraud_shapes, campaign_days=0))
    with pytest.raises(ConfigError, match="false_report_rate"):
        dataclasses.replace(base, false_report_rate=1.5)
