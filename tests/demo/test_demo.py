"""`make demo` end to end, two nights: every component for real (Tansu, Spark, torchrun, MLflow,
`fraudctl serve` on uvicorn).

The second night must read only the new offsets (earlier nights are replayed into the fresh
in-memory broker byte-identically) and gate a new challenger against the first night's champion.
The demo runs the production cycle (pipeline.nightly.cycle): its records land in the night's ledger.
The scoring service serves the champion (on night 2 from before the cycle, so a promotion reaches
it as a hot reload), decides the next day's live payments, and is stopped before the broker.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pyarrow.dataset as pads
import pytest
from mlflow import MlflowClient

from pipeline.config import PROJECT_ROOT
from pipeline.demo.nights import DemoConfig, load_played
from pipeline.demo.run import run_demo
from pipeline.demo.serving import LIVE_PAYMENTS
from pipeline.ingest.config import load_ingest_config
from pipeline.nightly.records import NightLedger, NightReport
from pipeline.registry.config import load_registry_config, resolved_tracking_uri
from pipeline.training.config import derive_train_config, write_train_toml

SMALL = DemoConfig(num_cards=2500, num_merchants=500, first_night_days=35, days_per_night=1,
                   train_processes=2, dirty_records_per_night=12)
# The demo's 15 epochs make a good model; the test needs a model the gate can judge either way,
# and training is tested on its own (tests/training): 4 epochs halve the test's time.
TEST_EPOCHS = 4


@pytest.fixture
def dev_conf_training_shorter(tmp_path, monkeypatch):
    """conf/dev as a deployment's own directory ($FRAUD_CONF_DIR), training TEST_EPOCHS epochs."""
    conf = tmp_path / "conf"
    shutil.copytree(PROJECT_ROOT / "conf" / "dev", conf)
    write_train_toml(derive_train_config("dev", {"loop": {"epochs": TEST_EPOCHS}}), conf / "train.toml")
    monkeypatch.setenv("FRAUD_CONF_DIR", str(conf))
    return conf


def _raw_transaction_ids(state_dir):
    raw = load_ingest_config("dev").raw.root()
    files = [p for p in raw.rglob("*.parquet") if "quarantine" not in str(p) and "label" not in str(p)]
    table = pads.dataset(files, format="parquet").to_table(columns=["transaction_id"])
    return table.column("transaction_id").to_pylist()


DECISION = re.compile(r"^   tx-\S+ +\d+\.\d\d [A-Z]{3}  (fraud \(\w+\)|genuine) +score [01]\.\d{3}  "
                      r"(allow|review|block) +v(\d+)  by ")
STOPPED = re.compile(r"^   scoring service pid (\d+) stopped")


def _check_serving(lines: list[str], champion: int | None) -> None:
    """The live payments were decided by ``champion``, and the service was stopped (by pid) before the broker."""
    out = "\n".join(lines)
    if champion is None:
        assert "scoring service: not started (no champion yet)" in out
        return
    decided = [m for m in map(DECISION.match, lines) if m]
    assert len(decided) == LIVE_PAYMENTS and {int(m.group(3)) for m in decided} == {champion}
    assert "fraudctl serve: pid" in out and "on http://127.0.0.1:" in out
    stop = next(i for i, line in enumerate(lines) if STOPPED.match(line))
    assert stop < next(i for i, line in enumerate(lines) if line.startswith("   broker pid"))
    with pytest.raises(ProcessLookupError):
        os.kill(int(STOPPED.match(lines[stop]).group(1)), 0)
    summary = out[out.index("== summary of night"):]
    day = re.search(rf"scoring service: (\d+) live payments of \S+ scored by v{champion} \((.*)\): "
                    r"(\d+\.\d\d)% sent to review or blocked against a review budget of (\d+\.\d\d)%", summary)
    assert day and int(day.group(1)) > 10 * LIVE_PAYMENTS  # the whole live day, not only the payments shown
    counts = {d: int(n) for n, d in re.findall(r"(\d+) (\w+)", day.group(2))}
    assert sum(counts.values()) == int(day.group(1))
    flagged = 100 * (counts.get("review", 0) + counts.get("block", 0)) / int(day.group(1))
    assert abs(flagged - float(day.group(3))) < 0.006
    # The version's thresholds were chosen for the budget on its validation split: a day of the same
    # portfolio is flagged near it (within a factor of 3 on one small day), not at ~0% as fixed 0.5 / 0.9 did.
    budget = float(day.group(4))
    assert budget / 3 <= flagged <= budget * 3
    assert re.search(rf"operating points of v{champion}: review >= [0-9.e-]+ \(budget: top", summary)
    assert re.search(r"frauds: \d+ of the day's \d+ frauds sent to review or blocked; \d+ of the \d+ frauds shown",
                     summary)


@pytest.mark.slow
@pytest.mark.timeout(2400)  # two nights of every component on a shared 2-core machine
def test_two_nights_publish_ingest_train_and_gate(state_dir, dev_conf_training_shorter):
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
    _check_serving(lines, first.gate.champion_version)
    if first.gate.promoted:
        assert "(the service started after the gate made it champion)" in out
    ids_after_first = _raw_transaction_ids(state_dir)
    assert len(ids_after_first) == len(set(ids_after_first))  # the night's duplicates were dropped

    assert first.monitor is not None and re.search(r"live model, monitor \d{4}-\d\d-\d\d: ", summary)
    saved = (state_dir / "demo" / "scores.jsonl").read_text().splitlines()
    assert len(saved) == (int(re.search(r"scoring service: (\d+) live payments", out).group(1))
                          if first.gate.champion_version else 0)

    lines.clear()
    second = run_demo("dev", SMALL, lines.append)
    assert f"{len(saved)} earlier live decisions replayed into scores" in "\n".join(lines)
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
    out = "\n".join(lines)
    assert f"Gate {name}: challenger v2" in out

    # Night 2: the service ran beside the cycle on the first champion and followed the gate.
    _check_serving(lines, expected_champion)
    if first.gate.promoted:
        assert out.index("serving champion v1 beside the night") < out.index("== nightly cycle")
        if second.gate.promoted:
            assert re.search(r"hot reload: v1 -> v2 without a restart, live \d+\.\ds after the gate's decision", out)
        else:
            assert "serving champion v1; no reload tonight: the gate kept it" in out
