"""Benchmarks behind ``fraudctl bench <name>`` / ``make bench``.

Each benchmark is a module ``pipeline.bench.<name>`` with ``run(quick: bool) -> dict``; the
runner writes the dict to ``bench/results/<name>.json``. Benchmarks compare against a named peer
measured in the same run (ratios, not absolute times: machines here are noisy).
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

from pipeline.atomic import write_json_atomic
from pipeline.config import PROJECT_ROOT

# name -> what it compares; the module pipeline.bench.<name> must exist.
BENCHMARKS: dict[str, str] = {
    "simulate": "simulator events/s vs the >=100k/s requirement",
    "ingest": "Spark ingest into the raw store vs one confluent-kafka reader + json.loads (rows/s ratio); features s/million",
    "train": "DDP samples/s with 1 vs 2 processes (1 thread each): scaling efficiency vs the >=0.9 goal",
    "compression": "dense vs top-k (with/without error feedback) at density 0.01/0.001: bytes/step, AUC, AP",
    "scoring": "our scoring service (online features) vs mlflow models serve on the same champion, 8 concurrent: "
               "p50/p99/rps, p99 ratio, hot-swap errors; a lone request vs the in-process scoring path; open-loop "
               "p50/p99/p99.9 at 100/300/1000 req/s; the highest rate with p99 < 20 ms, ours vs mlflow serve's",
    "soak": "fraudctl serve for 10 minutes at 300 req/s open loop, a model swap and a rules refresh half-way: errors, "
            "RSS growth, p99 drift (first vs last minute)",
    "partitions": "two scoring partitions behind fraudctl route vs one fraudctl serve, same payments, 8 concurrent: "
                  "rps ratio, p50/p99, errors",
    "baseline": "our model vs LightGBM on the same features and split, three portfolios in two layouts (standard "
                "14/5/7/7 days, short 7/1/7/7): AUC, AP, card precision@100, train time, per-seed differences with "
                "LightGBM, validation vs test-week calibration (ECE, with and without the prior-shift correction)",
    "features": "one night's incremental feature table update vs a full rebuild of the dev window, and the full "
                "rebuild vs Spark's bare two-pass shuffle+sort floor (plus the online-state fields when measured)",
    "lookback_vocabulary": "a night's lookback-cache cost (s, vocabulary ids and bytes, peak RSS) after 1 and 10 "
                           "turnovers of the card base, without vs with vocabulary compaction",
    "scale": "the nightly feature step (spark engine on local-cluster; the local engine as the peer up to 4x) and the "
             "identity check at 1x, 4x and 16x the dev portfolio's payments per day: peak RSS per process (driver, "
             "each executor), seconds per million payments, shuffle bytes",
    "decisions": "review budget vs realised review rate, recall/precision at the budget vs LightGBM, review rate "
                 "change at a champion swap (operating points vs absolute thresholds), days to detect a stuck feature",
}

RESULTS_DIR = PROJECT_ROOT / "bench" / "results"


def run_benchmark(name: str, quick: bool = False, results_dir: Path = RESULTS_DIR) -> Path:
    """Run benchmark ``name`` and write its JSON result; returns the result path."""
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; choose from {sorted(BENCHMARKS)}")
    module = importlib.import_module(f"pipeline.bench.{name}")
    started = time.time()
    result = module.run(quick=quick)
    result.setdefault("benchmark", name)
    result.setdefault("quick", quick)
    result["wall_s"] = round(time.time() - started, 2)
    out = results_dir / f"{name}.json"
    write_json_atomic(out, result, durable=False)
    return out
