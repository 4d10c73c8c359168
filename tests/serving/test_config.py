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
])
def test_bad_values_are_refused_by_key(tmp_path, text, message):
    path = tmp_path / "serving.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_serving_config(path=path)
