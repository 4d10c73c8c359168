"""`make demo` end to end, two nights: every component for real (Tansu, Spark, torchrun, MLflow).

The second night must read only the new offsets (earlier nights are replayed into the fresh
in-memory broker byte-identically) and gate a new challenger against the first night's champion.
The demo runs the production cycle (pipeline.nightly.cycle): its records land in the night's ledger.
"""

from __future__ import annotations

import json

import pyarrow.dataset as pads
import pytest
from mlflow import MlflowClient

from pipeline.demo.nights import DemoConfig, load_played
from pipeline.demo.run import run_demo
from pipeline.ingest.config import load_ingest_config
from pipeline.nightly.records import NightLedger, NightReport
from pipeline.registry.config import load_registry_config, resolved_tracking_uri

SMALL = DemoConfig(num_cards=2500, num_merchants=500, first_night_days=35, days_per_night=1,
                   train_processes=2, dirty_records_per_night=12)


def _raw_transaction_ids(state_dir):
    raw = load_ingest_config("dev").raw.root()
    files = [p for p in raw.rglob("*.parquet") if "quarantine" not in str(p) and "label" not in str(p)]
    table = pads.dataset(files, format="parquet").to_table(columns=["transaction_id"])
    return table.column("transaction_id").to_pylist()


@pytest.mark.slow
def test_two_nights_publish_ingest_train_and_gate(state_dir):
    lines: list[str] = []
    first = run_demo("dev", SMALL, lines.append)
    # Promoted, or rejected with reasons: both are decisions, not errors.
    assert first.gate.outcome in ("promoted", "rejected") and first.gate.reasons
    out = "\n".join(lines)
    assert "published" in out and "read back" in out and "Gate fraud-detector: challenger v1" in out
    assert first.run.run_dir == str(state_dir / "runs" / f"nightly-{first.dataset.version}")
    assert first.run.world_size == SMALL.train_processes and first.run.compression.startswith("topk_ef")
    assert NightLedger(state_dir / "nightly" / first.run_date).read(NightReport) == first
    summary = out[out.index("== summary of night 1"):]
    assert f"fraud-detector v{first.model.version}" in summary and "mlflow ui --backend-store-uri sqlite:///" in summary
    assert "fraudctl history" in summary and str(state_dir) in summary
    assert load_played(state_dir) == 1
    ids_after_first = _raw_transaction_ids(state_dir)
    assert len(ids_after_first) == len(set(ids_after_first))  # the night's duplicates were dropped

    lines.clear()
    second = run_demo("dev", SMALL, lines.append)
    assert second.gate.compared_with == first.gate.champion_version
    assert load_played(state_dir) == 2
    ids_after_second = _raw_transaction_ids(state_dir)
    assert len(ids_after_second) == len(set(ids_after_second))  # replayed night 1 not re-ingested
    assert set(ids_after_first) < set(ids_after_second)

    # Night 2 read only its own records: its run manifest accounts for tonight's offsets alone.
    runs = sorted((load_ingest_config("dev").raw.root() / "_runs").glob("*.json"))
    assert len(runs) == 2
    tonight = json.loads(runs[-1].read_text())
    tx = next(a for a in tonight["accounting"] if a["kind"] == "transaction")
    new_rows = len(ids_after_second) - len(ids_after_first)
    assert tx["read"] == new_rows + tx["duplicates"] + tx["quarantined_total"]
    assert tx["quarantined_total"] + tx["duplicates"] == SMALL.dirty_records_per_night

    client = MlflowClient(tracking_uri=resolved_tracking_uri(load_registry_config("dev")))
    name = load_registry_config("dev").model_name
    assert int(client.get_model_version_by_alias(name, "challenger").version) == second.model.version == 2
    expected_champion = 2 if second.gate.promoted else 1 if first.gate.promoted else None
    aliases = {alias: int(v) for alias, v in client.get_registered_model(name).aliases.items()}
    assert aliases.get("champion") == expected_champion
    assert f"Gate {name}: challenger v2" in "\n".join(lines)
