"""ingest.toml: checked-in files load; unknown keys and unworkable values name the key."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError
from pipeline.ingest.config import load_ingest_config
from pipeline.ingest.session import session_settings


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_checked_in_configs_load(env):
    config = load_ingest_config(env)
    assert config.dataset.num_shards_per_date == 8
    assert config.source.format == "python"


def test_unknown_key_is_named_with_its_file(tmp_path):
    path = tmp_path / "ingest.toml"
    path.write_text("[dataset]\nnum_shard = 4\n")
    with pytest.raises(ConfigError, match=r"ingest.toml: unknown key 'dataset.num_shard'"):
        load_ingest_config(path=path)


def test_unworkable_values_are_refused(tmp_path):
    path = tmp_path / "ingest.toml"
    path.write_text("[dataset]\nnum_shards_per_date = 0\ntest_days = 0\n")
    with pytest.raises(ConfigError, match="num_shards_per_date must be >= 1.*test_days must be >= 1"):
        load_ingest_config(path=path)
    path.write_text("[features]\nrows_per_task = 0\n")
    with pytest.raises(ConfigError, match="features.rows_per_task must be >= 1, got 0"):
        load_ingest_config(path=path)
    path.write_text('[raw]\nindex_lookup = "executors"\n')
    with pytest.raises(ConfigError, match=r"raw.index_lookup must be one of \['driver', 'spark'\], got 'executors'"):
        load_ingest_config(path=path)
    path.write_text('[raw]\nindex_lookup_tasks = 17\n')
    with pytest.raises(ConfigError, match=r"raw.index_lookup_tasks must be in \[1, 16\] \(one task per index bucket"):
        load_ingest_config(path=path)


def test_master_precedence_cli_then_env_then_file(monkeypatch, tmp_path):
    path = tmp_path / "ingest.toml"
    path.write_text('[spark]\nmaster = "local[1]"\n')
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    assert session_settings(load_ingest_config(path=path).spark)["spark.master"] == "local[1]"
    monkeypatch.setenv("SPARK_MASTER", "local[3]")
    spark = load_ingest_config(path=path).spark
    assert session_settings(spark)["spark.master"] == "local[3]"
    assert session_settings(spark, master="local-cluster[2,1,1024]")["spark.master"] == "local-cluster[2,1,1024]"
    assert session_settings(spark)["spark.sql.session.timeZone"] == "UTC"
