"""The nightly cycle's own logic, without running the jobs: config, the records each stage hands
on, the night's ledger, the training stage's pinning and reuse, the verdict line, the CLI.

The stages end to end (Spark, torchrun, MLflow) run in tests/airflow/test_fraud_nightly.py under
Airflow and in tests/demo/test_demo.py through ``run_cycle``.
"""

from __future__ import annotations

import json
from datetime import date, timedelta

import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.config import ConfigError
from pipeline.ingest.accounting import TopicAccounting
from pipeline.ingest.dataset_builder import DatasetSummary
from pipeline.ingest.job import IngestReport
from pipeline.nightly import stages, text
from pipeline.nightly.config import load_nightly_config
from pipeline.nightly.records import (
    GateOutcome,
    MonitoredVersion,
    MonitorOutcome,
    NightLedger,
    NightlyStageMissing,
    NightReport,
    PublishedDataset,
    RegisteredModel,
    TrainedRun,
)
from pipeline.training.config import load_train_config
from pipeline.training.launch import Torchrun, pin_train_config, torchrun_command
from pipeline.training.run_dir import CompressionSummary, DatasetRef, RunDir, RunSummary

RUN_DATE = date(2026, 2, 4)


def _dataset(version: str = "2026-02-04-0123456789ab", root: str = "/data/fraud-dev") -> PublishedDataset:
    return PublishedDataset(name="fraud-dev", root=root, version=version, label_cutoff="2026-02-04", rows=5000,
                            frauds=40, reused=False)


def _summary(dataset_version: str) -> RunSummary:
    return RunSummary(status="completed", run_name="r", global_step=30, epochs=2, best_epoch=1,
                      best_metrics={"auc_roc": 0.91, "average_precision": 0.4}, temperature=1.2,
                      bytes_sent_total=1000, bytes_dense_total=100_000,
                      compression=CompressionSummary("topk_ef", 0.01), world_size=2, wall_s=12.0, peak_rss_mb=300.0,
                      stopped_early=False, dataset=DatasetRef("fraud-dev", dataset_version, "abc"))


def test_checked_in_nightly_configs_load_and_describe_a_daily_2am_schedule():
    for env in ("dev", "prod"):
        config = load_nightly_config(env)
        assert config.schedule.cron == "0 2 * * *"
        assert config.schedule.retry_delay_s <= config.schedule.max_retry_delay_s
        assert config.train.nproc_per_node >= 1


def test_a_multi_node_training_config_needs_a_rendezvous_endpoint(tmp_path):
    path = tmp_path / "nightly.toml"
    path.write_text("[train]\nnnodes = 2\n")
    with pytest.raises(ConfigError, match="rdzv_endpoint"):
        load_nightly_config(path=path)
    path.write_text('[train]\nnnodes = 2\nnproc_per_node = 4\nrdzv_endpoint = "trainer-0:29400"\n')
    command = torchrun_command(load_nightly_config(path=path).train, ["--run-dir", "/r"], run_id="night")
    assert {"--nnodes=2", "--nproc-per-node=4", "--rdzv-endpoint=trainer-0:29400", "--rdzv-id=night"} <= set(command)


def test_single_node_training_rendezvouses_on_loopback_with_a_free_port():
    assert "--rdzv-endpoint=127.0.0.1:0" in torchrun_command(Torchrun(), [], run_id="x")


def test_the_ingest_record_is_read_from_the_jobs_report_as_json_writes_it(state_dir):
    accounting = (TopicAccounting("transactions", "transaction", read=112, valid=100, duplicates=4,
                                  quarantined={"bad_time": 5, "negative_amount": 1, "conflicting_duplicate": 2},
                                  offset_span=112),)
    dataset = DatasetSummary(name="fraud-dev", root="/d", version="2026-02-04-0123456789ab", manifest_path="/d/m.json",
                             content_hash="ff", label_cutoff="2026-02-04", rows=5000, frauds=40, splits={}, reused=True)
    report = IngestReport("run-1", "nightly", accounting, dataset, None, (), "/logs/run-1.log")
    # jobs/ingest.py --report-json: json.dumps(report.to_dict(), default=str)
    ledger = NightLedger.for_date(RUN_DATE)
    recorded = stages.record_ingest(json.loads(json.dumps(report.to_dict(), default=str)), ledger)
    assert (recorded.version, recorded.rows, recorded.reused, recorded.ingest_run_id) == (
        "2026-02-04-0123456789ab", 5000, True, "run-1")
    assert [(a.kind, a.read, a.valid, a.quarantined, a.duplicates, a.conflicting_duplicates)
            for a in recorded.landed] == [("transaction", 112, 100, 8, 4, 2)]
    assert ledger.read(PublishedDataset) == recorded


def test_a_report_without_a_dataset_is_not_an_ingest_record():
    with pytest.raises(ValueError, match="published no dataset"):
        PublishedDataset.from_ingest_report({"run_id": "run-2", "dataset": None, "accounting": []})


def test_records_from_xcom_are_checked_field_by_field():
    value = _dataset().to_dict()
    with pytest.raises(ValueError, match="unknown key 'extra'"):
        PublishedDataset.from_dict({**value, "extra": 1})
    with pytest.raises(ValueError, match="rows must be int"):
        PublishedDataset.from_dict({**value, "rows": "many"})


def test_a_stage_run_alone_names_the_stage_whose_record_is_missing(state_dir):
    with pytest.raises(NightlyStageMissing, match=r"no ingest record for 2026-02-04 .*--stage ingest"):
        NightLedger.for_date(RUN_DATE).read(PublishedDataset)


def test_training_reads_the_dataset_version_ingest_published_not_latest(state_dir, tmp_path):
    dataset = _dataset(root=str(tmp_path / "ds"))
    pinned = load_train_config(path=pin_train_config("dev", dataset.root, dataset.version, tmp_path / "train.toml"))
    checked_in = load_train_config("dev")
    assert (pinned.data.version, pinned.data.dataset_root) == (dataset.version, dataset.root)
    assert pinned.model == checked_in.model and pinned.loop == checked_in.loop  # the rest is the environment's


def test_a_finished_run_of_the_same_dataset_is_reused_without_launching(state_dir):
    dataset = _dataset()
    run = RunDir.named(stages.run_name_for(dataset))
    run.path.mkdir(parents=True)
    run.write_summary(_summary(dataset.version))
    ledger = NightLedger.for_date(RUN_DATE)
    trained = stages.train("dev", Torchrun(), dataset, ledger)
    assert trained.reused and trained.run_dir == str(run.path)
    assert trained.compression == "topk_ef density 0.01"
    assert not ledger.train_config.exists()  # no config pinned: nothing was launched
    assert ledger.read(TrainedRun) == trained


def test_a_run_directory_holding_another_dataset_version_stops_the_stage(state_dir):
    dataset = _dataset()
    run = RunDir.named(stages.run_name_for(dataset))
    run.path.mkdir(parents=True)
    run.write_summary(_summary("2026-02-04-ffffffffffff"))
    with pytest.raises(stages.StageFailed, match="train failed: .*holds a run on dataset version 2026-02-04-ffff"):
        stages.train("dev", Torchrun(), dataset, NightLedger.for_date(RUN_DATE))


def test_a_rejection_reads_as_a_normal_outcome_with_the_champion_kept():
    outcome = GateOutcome(outcome="rejected", promoted=False, challenger_version=5, compared_with=4,
                          champion_version=4, reasons=("auc_roc worse",), warnings=(), challenger_metrics={},
                          champion_metrics=None, replayed=False, text="")
    assert text.decision_line(outcome) == "decision: rejected v5 (a normal outcome; champion stays v4): auc_roc worse"


def test_fraudctl_nightly_stage_without_its_input_exits_1_naming_the_missing_stage(state_dir):
    result = CliRunner().invoke(cli, ["nightly", "--run-date", "2026-02-04", "--stage", "register"])
    assert result.exit_code == 1
    assert "no train record for 2026-02-04" in result.output and "--stage train" in result.output


def test_fraudctl_nightly_refuses_a_bad_date_as_a_usage_error():
    result = CliRunner().invoke(cli, ["nightly", "--run-date", "2026-02-31"])
    assert result.exit_code == 2


# ---- register and gate against a real MLflow store (SQLite under the test's state directory) --------


@pytest.fixture
def registered_night(state_dir, tmp_path, monkeypatch):
    """A published dataset, the night's finished run of a good model on it, and the registry config."""
    from pipeline.evaluation.config import GateConfig, Guardrail
    from pipeline.registry.config import RegistryConfig
    from tests.registry import factory

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = tmp_path / "dataset"
    manifest = factory.write_dataset(root)
    dataset = PublishedDataset(name=manifest.dataset, root=str(root), version=manifest.version,
                               label_cutoff=manifest.label_cutoff, rows=3200, frauds=200, reused=False)
    run = RunDir.named(stages.run_name_for(dataset))
    factory.write_run_dir(run.path, factory.train_model(root, manifest), root, manifest)
    # The factory's holdout is small once known-compromised cards are removed (8 frauds).
    registry = RegistryConfig(gate=GateConfig(first_model_auc_floor=0.7, ece_limit=Guardrail(0.2, "warn"),
                                              psi_limit=Guardrail(0.25, "warn"),
                                              min_holdout_frauds=Guardrail(5, "block")), lock_timeout_s=60.0)
    return dataset, registry, (root, manifest)


def test_register_and_gate_promote_the_nights_model_and_a_rerun_keeps_the_decision(registered_night):
    dataset, registry, _ = registered_night
    ledger = NightLedger.for_date(RUN_DATE)
    trained = stages.train("dev", Torchrun(), dataset, ledger)  # finished already: reused
    registered = stages.register(registry, trained, ledger)
    outcome = stages.gate(registry, registered, dataset, ledger)
    assert (outcome.outcome, outcome.champion_version) == ("promoted", registered.version), outcome.text
    assert "PROMOTED" in outcome.text and outcome.challenger_metrics["auc_roc"] > 0.7

    again = stages.gate(registry, stages.register(registry, trained, ledger), dataset, ledger)
    assert again.outcome == "promoted" and again.replayed  # not "already-champion": the night's decision
    assert ledger.read(GateOutcome) == outcome  # the ledger keeps the decision as first made


def test_gate_refuses_a_challenger_that_is_not_the_nights(registered_night, tmp_path):
    from pipeline.registry.tracking import register_run
    from tests.registry import factory

    dataset, registry, (root, manifest) = registered_night
    ledger = NightLedger.for_date(RUN_DATE)
    registered = stages.register(registry, stages.train("dev", Torchrun(), dataset, ledger), ledger)
    other = factory.write_run_dir(tmp_path / "someone-elses-run", factory.train_model(root, manifest, seed=3), root,
                                  manifest)
    assert register_run(other, registry) == registered.version + 1  # now the challenger
    with pytest.raises(stages.StageFailed, match=r"gate failed: challenger of fraud-detector is v2, not v1"):
        stages.gate(registry, registered, dataset, ledger)
    assert not ledger.record_path(GateOutcome).exists()


# ---- monitor: the live versions on the day whose labels matured by the run date -------------------


def _raw_store_through(root, last_day):
    import pandas as pd

    from tests.monitoring.raw_store import write_raw_store

    days = [last_day - timedelta(days=i) for i in range(8)]
    write_raw_store(root, pd.DataFrame({"transaction_id": [f"tx-{d}" for d in days], "card_id": "c",
                                        "event_time": [f"{d}T12:00:00Z" for d in days]}), [])


@pytest.mark.broker
def test_the_monitor_stage_without_scores_records_nothing_to_monitor_and_succeeds(state_dir, kafka_config, tmp_path):
    from pipeline.monitoring.config import MonitoringConfig
    from pipeline.monitoring.monitor import MonitorSources
    from pipeline.registry.config import RegistryConfig

    _raw_store_through(tmp_path / "raw", RUN_DATE)
    where = MonitorSources(kafka_config, f"scores-{kafka_config.transactions_topic}", tmp_path / "raw", 7,
                           RegistryConfig())
    ledger = NightLedger.for_date(RUN_DATE)
    monitored = stages.monitor(MonitoringConfig(), where, RUN_DATE, ledger)
    assert (monitored.monitored_date, monitored.state, monitored.exit_code) == ("2026-01-28", "nothing_to_monitor", 0)
    assert ledger.read(MonitorOutcome) == monitored
    assert text.monitor_line(monitored) == "monitor 2026-01-28: nothing_to_monitor"
    assert "does not exist: nothing was scored" in "\n".join(text.describe_monitor(monitored))
    assert (state_dir / "monitoring" / "2026-01-28" / "report.json").is_file()


def test_a_monitor_stage_whose_labels_have_not_matured_fails_naming_the_stage(state_dir, tmp_path):
    from pipeline.kafka.settings import KafkaConfig
    from pipeline.monitoring.config import MonitoringConfig
    from pipeline.monitoring.monitor import MonitorSources
    from pipeline.registry.config import RegistryConfig

    _raw_store_through(tmp_path / "raw", RUN_DATE - timedelta(days=1))  # the night's payments not ingested
    where = MonitorSources(KafkaConfig(), "scores", tmp_path / "raw", 7, RegistryConfig())
    with pytest.raises(stages.StageFailed, match=r"monitor failed: LabelsNotMature: .*mature on 2026-02-04"):
        stages.monitor(MonitoringConfig(), where, RUN_DATE, NightLedger.for_date(RUN_DATE))
    assert not NightLedger.for_date(RUN_DATE).record_path(MonitorOutcome).exists()


def test_a_degraded_model_reads_as_a_finding_of_a_successful_night():
    monitored = MonitorOutcome(
        monitored_date="2026-01-28", state="degraded", exit_code=4, rollbacks=(), report="/r.json", text="",
        versions=(MonitoredVersion(version=3, state="degraded", rows=900, frauds=40, recall=0.21,
                                   expected_recall=0.6, review_rate=0.005, review_budget=0.005),))
    assert text.monitor_line(monitored) == (
        "monitor 2026-01-28: degraded: v3 degraded (recall 0.210 vs expected 0.600, 40 frauds in 900 payments) "
        "(a finding, not a failure: `fraudctl monitor` would exit 4)")
    assert MonitorOutcome.from_dict(monitored.to_dict()) == monitored  # what XCom and the ledger carry


def test_a_night_report_recorded_before_the_monitor_stage_still_reads():
    outcome = GateOutcome(outcome="promoted", promoted=True, challenger_version=1, compared_with=None,
                          champion_version=1, reasons=(), warnings=(), challenger_metrics={}, champion_metrics=None,
                          replayed=False, text="")
    run = TrainedRun(run_dir="/r", dataset_version="v", best_epoch=1, best_metrics={}, world_size=2, compression="topk",
                     bytes_sent_total=1, bytes_dense_total=2, wall_s=1.0, reused=True)
    old = NightReport("2026-02-04", _dataset(), run, RegisteredModel("fd", 1, "/r"), outcome).to_dict()
    del old["monitor"]
    night = NightReport.from_dict(old)
    assert night.monitor is None and text.describe_night(night)[-1].startswith("monitor: not run")
