"""Config loading: typed slices, unknown keys rejected by name and file, env and CLI overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.config import ConfigError, env_override, from_dict, load_section
from pipeline.kafka.settings import KafkaConfig, load_kafka_config


@dataclass(frozen=True)
class Inner:
    rate: float = 0.5
    mode: str = "a"


@dataclass(frozen=True)
class Outer:
    name: str
    retries: int = 3
    hosts: tuple[str, ...] = ()
    endpoint: str = env_override("TEST_ENDPOINT", "local")
    inner: Inner = field(default_factory=Inner)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "outer.toml"
    path.write_text(text)
    return path


def test_loads_nested_typed_values(tmp_path):
    path = _write(tmp_path, 'name = "x"\nretries = 5\nhosts = ["a", "b"]\n[inner]\nrate = 1\n')
    cfg = load_section(Outer, "outer", path=path)
    assert cfg == Outer(name="x", retries=5, hosts=("a", "b"), inner=Inner(rate=1.0))
    assert isinstance(cfg.inner.rate, float)


def test_unknown_key_names_key_and_file(tmp_path):
    path = _write(tmp_path, 'name = "x"\n[inner]\nrat = 1.0\n')
    with pytest.raises(ConfigError) as err:
        load_section(Outer, "outer", path=path)
    assert "inner.rat" in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('name = "x"\nretries = "many"\n', "retries must be int"),
        ('name = "x"\nretries = true\n', "retries must be int"),
        ("retries = 1\n", "missing required key 'name'"),
        ('name = "x"\ninner = 3\n', "must be a table"),
        ("name = \n", "invalid TOML"),
    ],
)
def test_type_errors_are_explained(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle):
        load_section(Outer, "outer", path=_write(tmp_path, text))


def test_env_var_overrides_file_and_cli_overrides_both(tmp_path, monkeypatch):
    path = _write(tmp_path, 'name = "x"\nendpoint = "from-file"\n')
    assert load_section(Outer, "outer", path=path).endpoint == "from-file"
    monkeypatch.setenv("TEST_ENDPOINT", "from-env")
    cfg = load_section(Outer, "outer", path=path)
    assert cfg.endpoint == "from-env"
    assert dataclasses.replace(cfg, endpoint="from-cli").endpoint == "from-cli"


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_section(Outer, "nope", path=tmp_path / "nope.toml")


def test_from_dict_rejects_unknown_top_level_key():
    with pytest.raises(ConfigError, match="unknown key 'nmae'"):
        from_dict(Outer, {"nmae": "x"})


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_checked_in_kafka_configs_load(env, monkeypatch):
    for var in ("KAFKA_BOOTSTRAP_SERVERS", "KAFKA_SECURITY_PROTOCOL", "KAFKA_SASL_MECHANISM"):
        monkeypatch.delenv(var, raising=False)
    cfg = load_kafka_config(env)
    assert isinstance(cfg, KafkaConfig) and cfg.partitions >= 1


def test_kafka_security_settings_pass_through_to_clients(monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "b1:9093,b2:9093")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "svc-fraud")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "s3cret")
    cfg = load_kafka_config("prod")
    assert cfg.confluent()["bootstrap.servers"] == "b1:9093,b2:9093"
    assert cfg.confluent()["sasl.username"] == "svc-fraud"
    assert cfg.confluent()["security.protocol"] == "SASL_SSL"
    assert cfg.kafka_python()["bootstrap_servers"] == ["b1:9093", "b2:9093"]
    assert cfg.kafka_python()["sasl_plain_password"] == "s3cret"
