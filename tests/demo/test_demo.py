"""`make demo` as a user runs it: `fraudctl demo` with the shipped dev configuration, two nights, every
component for real (Tansu, Spark, torchrun, MLflow, `fraudctl serve` on uvicorn).

Night 1 must make a champion (a night without one never starts the service, and would prove nothing
about serving); every night with a champion must score its whole live day through the service. What
the service decided is read back from what it published (the scores topic the demo saves), and the
live day's payments and frauds from the simulator itself, so neither side of a figure comes from the
code that printed it. Night 2 must read only the new offsets (earlier nights are replayed into the
fresh in-memory broker byte-identically), gate a new challenger against night 1's champion, and reach
the running service as a hot reload when it is promoted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from datetime import date
from pathlib import Path

import pandas as pd
import pyarrow.dataset as pads
import pytest

from pipeline.demo.live_days import load_live_days
from pipeline.demo.nights import load_demo_config, load_played, plan_nights, simulate_night
from pipeline.demo.serving import LIVE_PAYMENTS, STOPPING
from pipeline.ingest.config import load_ingest_config
from pipeline.nightly.records import NightLedger, NightReport
from pipeline.registry.config import load_registry_config
from pipeline.registry.store import connect
from pipeline.serving.score_event import ScoreEvent
from pipeline.simulation import GENUINE, load_simulation_config

FRAUDCTL = str(Path(sys.executable).with_name("fraudctl"))
DECISION = re.compile(r"^   tx-\S+ +\d+\.\d\d [A-Z]{3}  (fraud \(\w+\)|genuine) +score [01]\.\d{3}  "
                      r"(allow|review|block) +v(\d+)  by ")
STOPPED = re.compile(r"^   scoring service pid (\d+) stopped")


def _demo(state_dir: Path) -> list[str]:
    """``fraudctl demo`` as ``make demo`` runs it (the shipped conf/dev, no overrides); its output lines."""
    env = {k: v for k, v in os.environ.items() if k not in ("FRAUD_CONF_DIR", "FRAUD_ENV")}
    done = subprocess.run([FRAUDCTL, "demo"], env=env | {"FRAUD_STATE_DIR": str(state_dir)},
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"fraudctl demo exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout.splitlines()


def _live_day(night: int):
    """The live day scored after night ``night`` (1-based), as the simulator makes it."""
    demo, base = load_demo_config("dev"), load_simulation_config("dev")
    day = plan_nights(date.fromisoformat(base.start_date), night, demo)[-1]
    return day.start.isoformat(), simulate_night(day, base, demo)


def _published_decisions(state_dir: Path) -> list[ScoreEvent]:
    """Every decision the service published to the scores topic, as the demo saved it after each night."""
    import base64

    lines = (state_dir / "demo" / "scores.jsonl").read_text().splitlines()
    return [ScoreEvent.from_json(base64.b64decode(json.loads(line)["value"])) for line in lines]


def _check_live_day(state_dir: Path, night: int, champion: int, promoted_tonight: bool, lines: list[str]) -> None:
    """Night ``night`` scored its whole live day through the service with ``champion``, and
    live_days.jsonl says what the service published and the simulator knows."""
    day, sim = _live_day(night)
    truth = dict(zip(sim.truth["transaction_id"], sim.truth["pattern"], strict=True))
    published = [e for e in _published_decisions(state_dir) if e.transaction_id in truth]
    assert Counter(e.transaction_id for e in published) == Counter(truth.keys())  # every payment, once
    assert {e.model_version for e in published} == {champion}
    record = next(d for d in load_live_days(state_dir / "demo") if d.night == night)
    flagged = [e for e in published if e.decision in STOPPING]
    frauds = [e for e in published if truth[e.transaction_id] != GENUINE]
    assert (record.live_day, record.version, record.payments) == (day, champion, len(truth))
    assert record.flagged == len(flagged) and record.realised_review_rate == pytest.approx(len(flagged) / len(truth))
    assert record.frauds == len(frauds) == int(sim.truth["is_fraud"].sum()) > 0
    assert record.frauds_stopped == sum(e.decision in STOPPING for e in frauds)
    # Fraud as the holdout counts it: the latest report made before the day's label cutoff says fraud.
    cutoff = pd.Timestamp(day, tz="UTC") + pd.Timedelta(days=record.label_maturity_days + 1)
    latest: dict[str, tuple[pd.Timestamp, bool]] = {}
    for tid, is_fraud, at in zip(sim.labels["transaction_id"], sim.labels["is_fraud"],
                                 pd.to_datetime(sim.labels["reported_at"], utc=True), strict=True):
        if at < cutoff and (tid not in latest or at >= latest[tid][0]):
            latest[tid] = (at, bool(is_fraud))
    labelled = [e for e in published if latest.get(e.transaction_id, (None, False))[1]]
    assert record.label_maturity_days == load_ingest_config("dev").dataset.label_maturity_days
    assert record.frauds_reported == len(labelled) > 0
    assert record.frauds_reported_stopped == sum(e.decision in STOPPING for e in labelled)
    # The promise is the gate's figure for this version on tonight's holdout; when tonight's gate made it
    # champion, the registry recorded that figure on it.
    low, high = record.holdout_recall_ci
    assert 0.0 <= low <= record.holdout_recall_at_budget <= high <= 1.0 and high - low > 0.01
    if promoted_tonight:
        client = connect(load_registry_config("dev"))  # tracking and registry URIs both: an earlier test may have set either
        tags = client.get_model_version(load_registry_config("dev").model_name, str(champion)).tags
        assert record.review_budget == pytest.approx(float(tags["gate.review_budget"]))
        assert [record.holdout_recall_at_budget, low, high] == pytest.approx(
            [float(tags[f"gate.recall_at_budget{end}"]) for end in ("", "_lower", "_upper")], abs=1e-6)
    # The live decisions shown were made by the champion; the service stopped (by pid) before the broker.
    decided = [m for m in map(DECISION.match, lines) if m]
    assert len(decided) == LIVE_PAYMENTS and {int(m.group(3)) for m in decided} == {champion}
    stop = next(i for i, line in enumerate(lines) if STOPPED.match(line))
    assert stop < next(i for i, line in enumerate(lines) if line.startswith("   broker pid"))
    with pytest.raises(ProcessLookupError):
        os.kill(int(STOPPED.match(lines[stop]).group(1)), 0)


def _check_pooled_summary(state_dir: Path, lines: list[str]) -> None:
    """The summary's pooled lines add up every night's live day so far; the review budget holds."""
    days = load_live_days(state_dir / "demo")
    out = "\n".join(lines)
    summary = out[out.index("== summary"):]
    head = re.search(r"live days so far \((\d+) night\(s\), (\d+) payments\): (\d+) sent to review or blocked "
                     r"\((\d+\.\d\d)% against a budget of (\d+\.\d\d)%\)", summary)
    assert head, summary
    assert tuple(int(head.group(i)) for i in (1, 2, 3)) == (
        len(days), sum(d.payments for d in days), sum(d.flagged for d in days))
    reported = re.search(r"frauds reported within \d+ days \(what the gate's holdout counts\): (\d+) of (\d+) stopped",
                         summary)
    truth = re.search(r"every fraud \(the simulator's truth, (\d+) of them reported later or never\): (\d+) of (\d+) "
                      r"stopped", summary)
    assert (int(reported.group(1)), int(reported.group(2))) == (
        sum(d.frauds_reported_stopped for d in days), sum(d.frauds_reported for d in days))
    assert (int(truth.group(2)), int(truth.group(3))) == (
        sum(d.frauds_stopped for d in days), sum(d.frauds for d in days))
    assert re.search(r"the gate's holdout promised recall \d\.\d{3} \(95% interval \d\.\d{3}-\d\.\d{3}\) at the "
                     r"budget: live recall of reported frauds is (inside|OUTSIDE) it", summary)
    # Each version starts from its scores on the latest day seen: the live days are flagged near the budget.
    budget = float(head.group(5))
    assert budget / 2 <= float(head.group(4)) <= budget * 1.5


def _raw_transaction_ids() -> list[str]:
    raw = load_ingest_config("dev").raw.root()
    files = [p for p in raw.rglob("*.parquet") if "quarantine" not in str(p) and "label" not in str(p)]
    return pads.dataset(files, format="parquet").to_table(columns=["transaction_id"]).column("transaction_id").to_pylist()


@pytest.mark.slow
@pytest.mark.timeout(2400)  # two nights of every component on a shared 2-core machine
def test_fraudctl_demo_two_nights_score_their_whole_live_days(state_dir):
    lines = _demo(state_dir)
    night_1 = plan_nights(date.fromisoformat(load_simulation_config("dev").start_date), 0, load_demo_config("dev"))[-1]
    first = NightLedger(state_dir / "nightly" / night_1.run_date.isoformat()).read(NightReport)
    out = "\n".join(lines)
    assert first.gate.promoted and first.gate.champion_version == 1, first.gate.reasons  # a champion on night 1
    assert "published" in out and "read back" in out and "Gate fraud-detector: challenger v1" in out
    assert first.run.world_size == load_demo_config("dev").train_processes
    assert first.run.compression.startswith("topk_ef")
    assert "(the service started after the gate made it champion)" in out
    assert "mlflow ui --backend-store-uri sqlite:///" in out and str(state_dir) in out
    assert load_played(state_dir) == 1
    _check_live_day(state_dir, 1, 1, True, lines)
    _check_pooled_summary(state_dir, lines)
    ids_after_first = _raw_transaction_ids()
    assert len(ids_after_first) == len(set(ids_after_first))  # the night's duplicates were dropped

    lines = _demo(state_dir)
    out = "\n".join(lines)
    second = NightLedger(state_dir / "nightly" / re.search(r"== nightly cycle for (\S+):", out).group(1)
                         ).read(NightReport)
    assert re.search(r"[1-9]\d* earlier live decisions replayed into scores", out)
    assert second.gate.compared_with == 1 and load_played(state_dir) == 2
    champion = second.gate.champion_version
    assert out.index("serving champion v1 beside the night") < out.index("== nightly cycle")
    if second.gate.promoted:
        assert re.search(r"hot reload: v1 -> v2 without a restart, live (\d+\.\ds after the gate's decision|"
                         r"before the gate had finished recording its decision)", out)
    else:
        assert "serving champion v1; no reload tonight: the gate kept it" in out
    _check_live_day(state_dir, 2, champion, second.gate.promoted, lines)
    _check_pooled_summary(state_dir, lines)
    assert [d.night for d in load_live_days(state_dir / "demo")] == [1, 2]

    # Night 2 read only its own records: its run manifest accounts for tonight's offsets alone.
    ids_after_second = _raw_transaction_ids()
    assert len(ids_after_second) == len(set(ids_after_second)) and set(ids_after_first) < set(ids_after_second)
    runs = sorted((load_ingest_config("dev").raw.root() / "_runs").glob("*.json"))
    tx = next(a for a in json.loads(runs[-1].read_text())["accounting"] if a["kind"] == "transaction")
    assert len(runs) == 2 and tx["read"] == len(ids_after_second) - len(ids_after_first) + tx["duplicates"] + \
        tx["quarantined_total"]
    assert tx["quarantined_total"] + tx["duplicates"] == load_demo_config("dev").dirty_records_per_night
