"""The serving benchmarks' shared set-up: the pure parts (publishing is run by ``bench ... --quick``)."""

from __future__ import annotations

import json

import httpx
import pandas as pd
import pytest

from pipeline.bench.served_history import conf_dir, ready_when, records


def _health(version: int, consumed: dict[str, int], status: int = 200) -> httpx.Response:
    return httpx.Response(status, content=json.dumps({"model": {"version": version},
                                                      "stream": {"consumed": consumed}}))


def test_ready_when_wants_the_version_live_and_the_whole_history_consumed():
    ready = ready_when(2, consumed=10)
    assert ready(_health(2, {"transactions": 7, "labels": 3}))
    assert ready(_health(2, {"transactions": 9, "labels": 3}))
    assert not ready(_health(2, {"transactions": 7, "labels": 2}))
    assert not ready(_health(1, {"transactions": 7, "labels": 3}))
    assert not ready(_health(2, {"transactions": 7, "labels": 3}, status=503))


def test_records_leave_missing_fields_out():
    frame = pd.DataFrame({"transaction_id": ["a", "b"], "device_id": ["d1", None]})
    assert records(frame) == [{"transaction_id": "a", "device_id": "d1"}, {"transaction_id": "b"}]


def test_conf_dir_copies_conf_dev_with_the_model_values_given(tmp_path):
    conf = conf_dir(tmp_path, "conf-explain-all", explain_min_score=0.0)
    assert "\nexplain_min_score = 0.0 " in (conf / "serving.toml").read_text()
    assert (conf / "ingest.toml").exists()
    with pytest.raises(AssertionError, match="no no_such_key line"):
        conf_dir(tmp_path, "conf-bad", no_such_key=1.0)
