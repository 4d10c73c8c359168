"""The simulate benchmark reports its figures against the requirement."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.bench import run_benchmark


def test_quick_benchmark_writes_rate_and_ratio(tmp_path: Path) -> None:
    result = json.loads(run_benchmark("simulate", quick=True, results_dir=tmp_path).read_text())
    assert result["events"] >= 100_000
    assert result["target_events_per_s"] == 100_000
    assert result["ratio"] == round(result["events_per_s"] / 100_000, 2)
    assert result["events_per_s"] > 0 and result["jsonl_events_per_s"] > 0
