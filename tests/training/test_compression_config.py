"""Validation of the [compression] options that correct top-k under AdamW."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError
from pipeline.training.config import load_train_config, train_config_from_dict
from tests.training.dataset_factory import train_config_dict


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_checked_in_configs_can_turn_every_correction_on(env):
    # Off by default until the full-size compression bench shows a gain; switching them on must then be
    # the only edit needed (the env's method and dense warm-up must allow them).
    from pipeline.training.config import derive_train_config

    on = {"freeze_variance": True, "local_clipping": True, "select_by_update": True}
    assert not any(getattr(load_train_config(env).compression, key) for key in on)
    compression = train_config_from_dict(derive_train_config(env, {"compression": on})).compression
    assert compression.freeze_variance and compression.local_clipping and compression.select_by_update


OFF = {"freeze_variance": False, "local_clipping": False, "select_by_update": False}


@pytest.mark.parametrize(("overrides", "named"), [
    ({"method": "allreduce", "freeze_variance": True}, "compression.freeze_variance"),
    ({"method": "topk_ef", "freeze_variance": True, "dense_warmup_steps": 0}, "dense_warmup_steps >= 1"),
    ({"method": "topk", "local_clipping": True}, "compression.local_clipping"),
    ({"method": "fp16", "local_clipping": True}, "compression.local_clipping"),
    ({"method": "topk_ef", "select_by_update": True}, "compression.select_by_update"),
])
def test_a_correction_where_it_cannot_apply_is_rejected_with_its_name(overrides, named):
    with pytest.raises(ConfigError, match=named):
        train_config_from_dict(train_config_dict({"compression": {**OFF, **overrides}}))


def test_the_corrections_are_accepted_where_they_apply():
    config = train_config_from_dict(train_config_dict({"compression": {
        "method": "topk", "freeze_variance": True, "local_clipping": False, "dense_warmup_steps": 1}}))
    assert config.compression.freeze_variance
    config = train_config_from_dict(train_config_dict({"compression": {
        "method": "topk_ef", "freeze_variance": True, "local_clipping": True, "select_by_update": True}}))
    assert config.compression.local_clipping and config.compression.select_by_update


@pytest.mark.parametrize(("overrides", "named"), [
    # The width is the method's (int8): a width option would have one legal value, so there is none.
    ({"method": "int8_ef", "quantization_bits": 8}, "unknown key 'compression.quantization_bits'"),
    ({"method": "int8", "quantization_chunk": 0}, "compression.quantization_chunk"),
    ({"method": "topk_int8_ef", "density": 1.5}, r"compression.density must be in \(0, 1\], got 1.5"),
    ({"method": "topk_int8_ef", "density": -0.001}, r"compression.density must be in \(0, 1\]"),
    ({"method": "powersgd", "powersgd_rank": 0}, "compression.powersgd_rank"),
    ({"method": "allreduce", "bucket_cap_mb": 0.0}, "compression.bucket_cap_mb"),
    # PowerSGD combined with what only top-k does:
    ({"method": "powersgd", "dense_warmup_exchange": "int8"}, "dense_warmup_exchange = 'int8' applies to the top-k"),
    ({"method": "powersgd", "freeze_variance": True}, "freeze_variance applies to the top-k methods only.*'powersgd'"),
    ({"method": "powersgd", "local_clipping": True}, "local_clipping applies to the top-k.*'powersgd'"),
    ({"method": "int8_ef", "dense_warmup_exchange": "int8"}, "'int8_ef' has no top-k warm-up"),
    ({"method": "topk", "local_clipping": True}, "compression.local_clipping"),
])
def test_a_bad_or_incompatible_compression_option_is_refused_with_the_reason(overrides, named):
    with pytest.raises(ConfigError, match=named):
        train_config_from_dict(train_config_dict({"compression": {**OFF, **overrides}}))


@pytest.mark.parametrize("overrides", [
    {"method": "int8"},
    {"method": "int8_ef", "quantization_chunk": 512},
    {"method": "topk_int8_ef", "density": 0.001, "dense_warmup_exchange": "int8", "density_warmup_start": 0.1},
    {"method": "topk_int8_ef", "local_clipping": True, "freeze_variance": True, "select_by_update": True},
    {"method": "topk_ef", "dense_warmup_exchange": "int8"},
    {"method": "powersgd", "powersgd_rank": 2},
    {"method": "bf16", "bucket_cap_mb": 1.0},
])
def test_the_new_methods_and_options_load(overrides):
    compression = train_config_from_dict(train_config_dict({"compression": {**OFF, **overrides}})).compression
    assert all(getattr(compression, key) == value for key, value in overrides.items())


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_checked_in_configs_keep_todays_exchange(env):
    compression = load_train_config(env).compression
    assert compression.method == "topk_ef" and compression.dense_warmup_exchange == "allreduce"
    assert compression.bucket_cap_mb == 25.0  # DDP's default
