"""serving.toml: the checked-in files load, bad values are refused by key, the token comes from the env."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError
from pipeline.serving.config import ADMIN_TOKEN_ENV, load_serving_config


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_checked_in_configs_load_and_bind_loopback(env, monkeypatch):
    monkeypatch.delenv("FRAUD_SERVING_HOST", raising=False)
    config = load_serving_config(env)
    assert config.server.host == "127.0.0.1"
    assert config.admin.token == ""  # never checked in
    assert config.decision.thresholds == "version"  # the versions' operating points decide
    assert config.alerts.review_rate_window_s <= max(config.alerts.rate_windows_s)


def test_admin_token_and_port_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "s3cret")
    monkeypatch.setenv("FRAUD_SERVING_PORT", "9123")
    config = load_serving_config("dev")
    assert (config.admin.token, config.server.port) == ("s3cret", 9123)


@pytest.mark.parametrize(("text", "message"), [
    ("[server]\nmax_body_bytes = 0\n", "server.max_body_bytes must be >= 1"),
    ("[decision]\nreview_threshold = 0.95\n", "review_threshold <= block_threshold"),
    ("[model]\npoll_interval = 5\n", "unknown key 'model.poll_interval'"),
    ("[model]\nshadow = \"yes\"\n", "model.shadow must be bool"),
    ("[decision]\nthresholds = \"fixed\"\n", r"decision.thresholds must be one of \['version', 'config'\]"),
    ("[decision]\nwithout_operating_points = \"warn\"\n", "decision.without_operating_points must be one of"),
    ("[alerts]\nrate_windows_s = []\n", "alerts.rate_windows_s must name at least one window"),
    ("[alerts]\nrate_windows_s = [300, 300]\n", "alerts.rate_windows_s must not repeat"),
    ("[alerts]\nrate_windows_s = [0]\n", "alerts.rate_windows_s and alerts.review_rate_window_s must be in 1..86400"),
    ("[alerts]\nreview_rate_window_s = 100000\n", "alerts.review_rate_window_s must be in 1..86400"),
    ("[alerts]\nrate_windows_s = 300\n", "alerts.rate_windows_s must be a list"),
    ("[alerts]\nrate_band = 0\n", "alerts.rate_band must be > 0"),
    ("[alerts]\ndegraded_after_s = -1\n", "alerts.degraded_after_s must be >= 0"),
    ("[alerts]\nmin_payments = 0\n", "alerts.min_payments must be >= 1"),
    ("[alerts]\ncheck_interval_s = 0\n", "alerts.check_interval_s must be > 0"),
    ("[alerts]\nband = 0.5\n", "unknown key 'alerts.band'"),
    ("[stream]\non_offset_gap = \"latest\"\n", r"stream.on_offset_gap must be one of \['wait', 'earliest'\]"),
    ("[stream]\nwatch_interval_s = 0\n", "stream.watch_interval_s and stream.stall_after_s must be > 0"),
    ("[stream]\nstall_after_s = -5\n", "stream.watch_interval_s and stream.stall_after_s must be > 0"),
])
def test_bad_values_are_refused_by_key(tmp_path, text, message):
    path = tmp_path / "serving.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_serving_config(path=path)


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_the_checked_in_margins_cover_ingests_lateness_bound(env):
    from pipeline.ingest.config import load_ingest_config
    assert load_serving_config(env).stream.expiry_margin_hours >= 24 * load_ingest_config(env).raw.max_lateness_days


def test_an_expiry_margin_below_ingests_lateness_bound_is_refused_naming_what_to_set(tmp_path):
    path = tmp_path / "serving.toml"
    path.write_text("[stream]\nexpiry_margin_hours = 48.0\n")
    # No ingest.toml beside it: the environment's bound (conf/dev: 7 days).
    with pytest.raises(ConfigError, match=r"stream.expiry_margin_hours = 48 is shorter than the 168 h a payment "
                                          r"may be late \(ingest.toml's \[raw\] max_lateness_days = 7\).*set "
                                          r"\[stream\] expiry_margin_hours to at least 168 "):
        load_serving_config("dev", path=path)
    # The ingest.toml beside it decides: two days late at most, so 48 h is enough ...
    (tmp_path / "ingest.toml").write_text("[raw]\nmax_lateness_days = 2.0\n")
    assert load_serving_config("dev", path=path).stream.expiry_margin_hours == 48.0
    # ... unless late payments are judged against the clock, which the watermark may lead by the clock skew.
    path.write_text("[stream]\nexpiry_margin_hours = 48.0\n[time_rules]\nlate_against = \"clock\"\n")
    with pytest.raises(ConfigError, match=r"plus max_clock_skew_s .* expiry_margin_hours to at least 48\.0833"):
        load_serving_config("dev", path=path)
