"""monitoring.toml: the checked-in files load, and values that cannot work are refused by name."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError
from pipeline.monitoring.config import MonitoringConfig, load_monitoring_config
from pipeline.monitoring.sources import VALIDATION_SCORES


def test_checked_in_monitoring_configs_load_with_auto_rollback_off():
    for env in ("dev", "prod"):
        config = load_monitoring_config(env)
        assert config.auto_rollback is False  # opt-in only
        assert config.degraded_after_days >= 1 and config.min_frauds >= 1


@pytest.mark.parametrize(("text", "message"), [
    ("degraded_after_days = 0", "degraded_after_days must be >= 1"),
    ("recall_margin = 1.5", "recall_margin must be in"),
    ("min_frauds = 0", "min_frauds must be >= 1"),
    ("alert_rate_band = 0", "alert_rate_band must be > 0"),
    ("auto_rollback = 'yes'", "auto_rollback must be bool"),
    ("rollback = true", "unknown key 'rollback'"),
    ("segment_features = ['channel_code', 'channel']", "segment_features must be code features .*unknown: channel"),
    ("segment_kept = 1.0", "segment_kept must be in"),
    ("range_features = ['amount', 'amount_cents']", "range_features must be numeric features, unknown: amount_cents"),
    ("out_of_range_share = -0.1", "out_of_range_share must be in"),
])
def test_a_value_that_cannot_work_is_refused_naming_the_key(tmp_path, text, message):
    path = tmp_path / "monitoring.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match=message):
        load_monitoring_config(path=path)


def test_the_validation_scores_are_read_where_registration_logs_them():
    from pipeline.registry.tracking import RUN_ARTIFACTS

    assert VALIDATION_SCORES == f"{RUN_ARTIFACTS}/validation_scores.parquet"
    assert MonitoringConfig().auto_rollback is False
