"""``fraudctl monitor`` against the real components: the Tansu broker's scores topic, a committed
raw store, the MLflow SQLite registry with versions registered from training runs."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.kafka.admin import create_topics
from pipeline.monitoring.tracking import date_step
from pipeline.registry.aliases import advance_champion, current_champion
from pipeline.registry.audit import read_history
from pipeline.registry.store import CHAMPION
from pipeline.serving.score_event import ScoreEvent
from tests.monitoring.conftest import MATURITY_DAYS, Deployment
from tests.monitoring.events import score_event
from tests.monitoring.live import publish, register, served_day
from tests.monitoring.raw_store import write_raw_store

pytestmark = pytest.mark.broker

DAY = date(2026, 3, 2)
UNSCORED = 3  # payments of the day the raw store holds and no decision covers


def monitor(deployment: Deployment, day: date, *args: str):
    return CliRunner().invoke(cli, ["monitor", "--date", day.isoformat(), *args],
                              env={"FRAUD_CONF_DIR": str(deployment.conf)})


def at(day: date, hours: float = 12.0) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC) + timedelta(hours=hours)


def live_day(deployment: Deployment, frame: pd.DataFrame, events: list[ScoreEvent], day: date) -> pd.DataFrame:
    """Publish the day's decisions (with resends, junk and a decision of the day before) and land its
    payments and fraud reports in the raw store; returns the labels the monitor should see."""
    create_topics(deployment.kafka, (deployment.scores_topic,), deployment.kafka.partitions)
    messages = [(e.transaction_id, e.to_json()) for e in [*events, *events[:5]]]  # 5 resent at the end
    yesterday = score_event(f"{day}-late", day - timedelta(days=1), 0.5, version=events[0].model_version)
    messages += [("junk", b"{not json"), (None, None), (yesterday.transaction_id, yesterday.to_json())]
    publish(deployment.kafka, deployment.scores_topic, messages)
    frauds = frame.loc[frame["label"] == 1, "transaction_id"].tolist()
    reports = [(tid, True, at(day + timedelta(days=2))) for tid in frauds[1:]]
    reports.append((frauds[0], True, at(day + timedelta(days=MATURITY_DAYS + 1))))  # after the maturity period
    genuine = frame.loc[frame["label"] == 0, "transaction_id"].iloc[0]
    reports += [(genuine, True, at(day + timedelta(days=1))), (genuine, False, at(day + timedelta(days=3)))]
    reports.append((f"{day}-never-scored", True, at(day + timedelta(days=1))))
    extra = pd.DataFrame({"transaction_id": [f"{day}-unscored-{i}" for i in range(UNSCORED)] + [f"{day}-later"],
                          "card_id": "c", "event_time": [at(day)] * UNSCORED + [at(day + timedelta(days=MATURITY_DAYS))]})
    payments = pd.concat([frame[["transaction_id", "card_id", "event_time"]], extra])
    write_raw_store(deployment.raw, payments, reports, run_id=f"run-{day}")
    return frame.assign(label=frame["transaction_id"].isin(frauds[1:]).astype(int))


def report_of(world, day: date) -> dict:
    return json.loads((world.state / "monitoring" / day.isoformat() / "report.json").read_text())


def test_a_live_day_is_judged_per_version_reported_and_logged_to_its_run(deployment, world, config, client):
    version, points = register(world, config, world.good, f"{config.model_name}-good")
    client.set_registered_model_alias(config.model_name, CHAMPION, str(version))
    frame, events = served_day(world, world.good, DAY, version, points)
    truth = live_day(deployment, frame, events, DAY)

    result = monitor(deployment, DAY)
    assert result.exit_code == 0, result.output
    assert f"v{version} ok:" in result.output
    report = report_of(world, DAY)
    assert report["state"] == "ok" and report["labels"]["reported_before"] == "2026-03-10T00:00:00+00:00"
    n = len(frame)
    assert report["accounting"]["score_events"] | {"examples": None} == {
        "read": n + 8, "used": n, "duplicates": 5, "unparseable": 2, "other_dates": 1, "no_thresholds": 0,
        "out_of_order": 5, "examples": None}  # the resends come after later decisions
    frauds = int(truth["label"].sum())
    assert report["accounting"]["reports"] == {"read": frauds + 3, "used": frauds + 1, "superseded": 1,
                                               "after_cutoff": 0, "other_dates": 0, "without_thresholds": 0,
                                               "never_scored": 1}
    assert report["accounting"]["payments"] == {"raw_store": n + UNSCORED, "decided": n,
                                                "missing_decisions": UNSCORED, "not_in_raw_store": 0}

    [v] = report["versions"]
    scores = np.array([e.score for e in events])
    flagged, fraud = scores >= points.review_threshold, truth["label"].to_numpy() == 1
    assert (v["version"], v["rows"], v["frauds"]) == (version, n, frauds)
    assert v["at_operating_points"]["recall"] == pytest.approx((flagged & fraud).sum() / fraud.sum())
    assert v["at_operating_points"]["review_rate"] == pytest.approx(flagged.mean())
    assert v["recall"]["expected"] == pytest.approx(points.validation.recall)
    assert v["recall"]["expected_source"] == "operating_points.validation.recall"
    # the day's fraud cards that got past the model, against the run's validation scores at its review threshold
    missed = v["missed_frauds"]
    assert missed["cards"] == len(set(truth.loc[fraud & ~flagged, "card_id"])) and missed["factor"] == 0.0
    assert missed["ratio_to_validation"] is not None and missed["ratio_to_validation"] >= 0 and not missed["above"]
    assert v["alert_rate"]["budget"] == 0.2 and v["thresholds"]["review"] == [points.review_threshold]
    assert set(v["feature_psi"]) == {"amount_log", "amount_rel_30d", "secs_since_prev_log", "merchant_fraud_rate_7d",
                                     "mcc", "channel"}
    assert max(v["feature_psi"].values()) < 0.25  # served = the training distribution
    assert 0 <= v["score_psi"] < 0.25 and v["feature_psi_sample"]["training"].startswith("1000 of ")
    assert (world.state / "monitoring" / DAY.isoformat() / "report.png").read_bytes()[:4] == b"\x89PNG"

    run_id = client.get_model_version(config.model_name, str(version)).run_id
    [recall] = client.get_metric_history(run_id, "monitor.recall")
    assert (recall.step, recall.value) == (date_step(DAY), pytest.approx(v["at_operating_points"]["recall"]))
    logged = {a.path for a in client.list_artifacts(run_id, f"monitoring/{DAY}")}
    assert logged == {f"monitoring/{DAY}/report.json", f"monitoring/{DAY}/report.png"}

    again = monitor(deployment, DAY, "--json")  # a re-run: the same report, nothing logged twice
    assert again.exit_code == 0, again.output
    assert json.loads(again.output) == report == report_of(world, DAY)
    assert len(client.get_metric_history(run_id, "monitor.recall")) == 1
    assert len(client.get_metric_history(run_id, "monitor.feature_psi.amount_log")) == 1


def test_a_day_whose_labels_have_not_matured_is_refused_with_exit_5(deployment):
    write_raw_store(deployment.raw, pd.DataFrame({"transaction_id": ["a"], "card_id": ["c"], "event_time": [at(DAY)]}), [])
    result = monitor(deployment, DAY - timedelta(days=MATURITY_DAYS - 1))
    assert result.exit_code == 5
    assert "mature on 2026-03-03" in result.output and "raw store ends on 2026-03-02" in result.output
    assert "monitor 2026-02-23 or earlier" in result.output


def test_without_a_scores_topic_there_is_nothing_to_monitor(deployment, world):
    day = DAY - timedelta(days=20)
    payments = pd.DataFrame({"transaction_id": ["a", "b"], "card_id": ["c", "c"],
                             "event_time": [at(day), at(day + timedelta(days=MATURITY_DAYS))]})
    write_raw_store(deployment.raw, payments, [])
    result = monitor(deployment, day)
    assert result.exit_code == 0, result.output
    assert "does not exist: nothing was scored" in result.output
    report = report_of(world, day)
    assert (report["state"], report["scores_topic"]["found"], report["versions"]) == ("nothing_to_monitor", False, [])
    assert report["accounting"]["payments"]["missing_decisions"] == 1


def test_a_degraded_champion_is_rolled_back_once_with_an_audit_record(deployment, world, config, client):
    deployment.write_monitoring(recall_margin=0.1, degraded_after_days=2, min_frauds=20, feature_sample_rows=1000,
                                auto_rollback=True)
    good, _ = register(world, config, world.good, f"{config.model_name}-v1")
    client.set_registered_model_alias(config.model_name, CHAMPION, str(good))
    bad, points = register(world, config, world.good, f"{config.model_name}-v2")
    advance_champion(client, config.model_name, bad, good)
    days = [DAY + timedelta(days=10), DAY + timedelta(days=11)]
    for day in days:  # served with the strongest feature stuck at its mean: the model cannot see it
        live_day(deployment, *served_day(world, world.good, day, bad, points, stuck={"amount_rel_30d": 0.0}), day)

    first = monitor(deployment, days[0])
    assert first.exit_code == 0, first.output  # below the floor once: not yet degraded
    [v] = report_of(world, days[0])["versions"]
    assert (v["state"], v["recall"]["below"], v["recall"]["days_below_in_a_row"]) == ("ok", True, 1)
    # The ranking is judged against the version's own validation AUC (from its validation scores),
    # here off (auc_margin 0): the stuck feature ranks the day's frauds below it.
    ranking = v["ranking"]
    assert 0.5 < ranking["auc"] < ranking["expected_auc"] and ranking["upper_bound"] > ranking["auc"]
    assert (ranking["margin"], ranking["floor"], ranking["below"]) == (0.0, None, False)
    assert v["feature_psi"]["amount_rel_30d"] > 1.0
    assert any("drifted from the training split" in f and "amount_rel_30d" in f for f in v["findings"])

    second = monitor(deployment, days[1])
    assert second.exit_code == 4, second.output
    report = report_of(world, days[1])
    assert report["state"] == "degraded" and report["versions"][0]["recall"]["days_below_in_a_row"] == 2
    [rollback] = report["rollbacks"]
    assert (rollback["version"], rollback["done"]) == (bad, True)
    assert current_champion(client, config.model_name) == good
    record = read_history(client, config.model_name)[-1]
    assert (record.action, record.actor, record.from_version, record.to_version) == ("rollback", "fraudctl-monitor",
                                                                                     bad, good)
    assert record.reason.startswith(f"monitor {days[1]}: v{bad} degraded: realised recall")

    audited = len(read_history(client, config.model_name))
    again = monitor(deployment, days[1])
    assert again.exit_code == 4, again.output
    [rollback] = report_of(world, days[1])["rollbacks"]
    assert rollback["done"] is False and rollback["detail"].startswith("rolled back earlier")
    assert len(read_history(client, config.model_name)) == audited and current_champion(client, config.model_name) == good
