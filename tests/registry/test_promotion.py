"""The promotion gate against a real MLflow SQLite store: decisions, records, idempotence, faults."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from pipeline.datasets.manifest import LABEL_COLUMN
from pipeline.datasets.reader import read_split
from pipeline.decisions.operating_points import JSON_TAG, operating_points_from_tags, split_figures
from pipeline.evaluation.config import Guardrail
from pipeline.evaluation.errors import HoldoutError
from pipeline.evaluation.report import (
    ALREADY_CHAMPION,
    EXIT_PROMOTED,
    EXIT_REJECTED,
    PROMOTED,
    REJECTED,
    format_gate_report,
)
from pipeline.kafka.broker import free_port
from pipeline.metrics import precision_at_rate, recall_at_rate
from pipeline.registry.audit import read_history
from pipeline.registry.errors import (
    ModelLoadError,
    NoChallenger,
    SignatureMismatch,
    TrackingUnavailable,
)
from pipeline.registry.promotion import GATE_TAG_PREFIX, run_gate
from pipeline.registry.rollback import rollback
from pipeline.registry.store import CHAMPION, PREVIOUS_CHAMPION, version_by_alias
from pipeline.registry.tracking import register_run
from tests.registry import factory
from tests.registry.conftest import version_artifact_dir


def register(world, config, label, model) -> int:
    return register_run(world.run_dir(f"{config.model_name}-{label}", model), config)


def alias(client, config, name) -> int | None:
    version = version_by_alias(client, config.model_name, name)
    return int(version.version) if version else None


def with_champion(world, config, model) -> int:
    """Register ``model`` and promote it as the first model."""
    version = register(world, config, "champion", model)
    assert run_gate(config).outcome == PROMOTED
    return version


def test_first_model_above_the_floor_is_promoted_and_audited(world, config, client):
    version = register(world, config, "first", world.good)
    report = run_gate(config, actor="nightly-dag")
    assert (report.outcome, report.exit_code, report.champion_version) == (PROMOTED, EXIT_PROMOTED, None)
    assert report.challenger_metrics["auc_roc"] == pytest.approx(
        factory.holdout_report(world.root, world.manifest, world.good)["auc_roc"])
    assert alias(client, config, CHAMPION) == version
    [record] = read_history(client, config.model_name)
    assert (record.action, record.actor, record.from_version, record.to_version) == ("promote", "nightly-dag", None, version)


def test_first_model_below_the_floor_is_rejected(world, config, client):
    config = replace(config, gate=replace(config.gate, first_model_auc_floor=0.99))
    register(world, config, "first", world.good)
    report = run_gate(config)
    assert (report.outcome, report.exit_code) == (REJECTED, EXIT_REJECTED)
    assert "below the floor 0.9900" in report.decision.reasons[0]
    assert alias(client, config, CHAMPION) is None


def test_better_challenger_is_promoted_and_the_old_champion_stays_reachable(world, config, client):
    old = with_champion(world, config, world.weak)
    new = register(world, config, "better", world.good)
    report = run_gate(config)
    assert (report.outcome, report.champion_version, report.challenger_version) == (PROMOTED, old, new)
    assert report.challenger_metrics["auc_roc"] > report.champion_metrics["auc_roc"]
    assert (alias(client, config, CHAMPION), alias(client, config, PREVIOUS_CHAMPION)) == (new, old)
    tags = client.get_model_version(config.model_name, str(new)).tags
    assert tags["gate.outcome"] == PROMOTED and tags["gate.champion_version"] == str(old)
    assert float(tags["gate.champion_auc_roc"]) == pytest.approx(report.champion_metrics["auc_roc"], abs=1e-6)
    assert float(tags["gate.auc_roc"]) == pytest.approx(report.challenger_metrics["auc_roc"], abs=1e-6)
    stored = json.loads(next(v for k, v in tags.items() if k.startswith(GATE_TAG_PREFIX)))
    assert stored["champion_metrics"]["auc_roc"] == pytest.approx(report.champion_metrics["auc_roc"])
    auc = report.comparison.auc_roc  # paired interval of challenger - champion, by card
    assert auc.estimate == pytest.approx(report.challenger_metrics["auc_roc"] - report.champion_metrics["auc_roc"])
    assert auc.lower < auc.estimate < auc.upper and auc.method == "delong-clustered"
    for metric in ("auc_roc", "average_precision"):
        diff = getattr(report.comparison, metric)
        assert [float(tags[f"gate.diff_{metric}{end}"]) for end in ("_lower", "", "_upper")] == pytest.approx(
            [diff.lower, diff.estimate, diff.upper], abs=1e-6)
    assert float(tags["gate.psi"]) == pytest.approx(report.comparison.psi, abs=1e-6)
    assert stored["comparison"]["auc_roc"]["upper"] == pytest.approx(auc.upper)
    run_id = client.get_model_version(config.model_name, str(new)).run_id
    assert [a.path for a in client.list_artifacts(run_id, "gate")][0].endswith(".json")


def holdout_rows(world):
    """The gate's holdout rows, the plain way (as factory.holdout_report): labels and the frame."""
    frame = read_split(world.root, world.manifest, "test")
    earlier = pd.concat([read_split(world.root, world.manifest, split) for split in ("train", "validation")])
    frame = frame[~frame["card_id"].isin(earlier.loc[earlier[LABEL_COLUMN] == 1, "card_id"])]
    return frame[LABEL_COLUMN].to_numpy(), frame


def test_both_models_are_judged_at_the_challengers_budget_and_its_expectation_is_recorded(world, config, client):
    old = with_champion(world, config, world.weak)
    new = register(world, config, "budgeted", world.good)
    report = run_gate(config)
    tags = client.get_model_version(config.model_name, str(new)).tags
    points = operating_points_from_tags(tags)
    champion_points = operating_points_from_tags(client.get_model_version(config.model_name, str(old)).tags)
    budget = points.review_budget
    assert (report.review_budget, report.budget_source) == (budget, "the challenger's operating points")
    labels, frame = holdout_rows(world)
    chal, champ = factory.score(world.good, frame), factory.score(world.weak, frame)
    assert float(tags["gate.review_budget"]) == budget == 0.005
    assert float(tags["gate.recall_at_budget"]) == pytest.approx(recall_at_rate(labels, chal, budget), abs=1e-6)
    assert float(tags["gate.precision_at_budget"]) == pytest.approx(precision_at_rate(labels, chal, budget), abs=1e-6)
    assert float(tags["gate.champion_recall_at_budget"]) == pytest.approx(recall_at_rate(labels, champ, budget),
                                                                          abs=1e-6)
    diff = report.comparison.recall_at_budget  # paired, by card, on the same rows at the same budget
    assert diff.estimate == pytest.approx(recall_at_rate(labels, chal, budget) - recall_at_rate(labels, champ, budget))
    assert diff.method == "bootstrap-clustered" and diff.lower <= diff.estimate <= diff.upper
    assert [float(tags[f"gate.diff_recall_at_budget{end}"]) for end in ("_lower", "", "_upper")] == pytest.approx(
        [diff.lower, diff.estimate, diff.upper], abs=1e-6)
    assert float(tags["gate.diff_precision_at_budget"]) == pytest.approx(report.comparison.precision_at_budget.estimate,
                                                                         abs=1e-6)
    # Each model's own thresholds on the holdout; the challenger's are the monitor's expectation.
    own = split_figures(labels, chal, points.review_threshold, points.block_threshold)
    assert report.challenger_thresholds.holdout == own and report.challenger_thresholds.points == points
    assert report.champion_thresholds.points == champion_points
    assert [float(tags[f"gate.expected_{k}"]) for k in ("recall", "precision", "review_rate")] == pytest.approx(
        [own.recall, own.precision, own.review_rate], abs=1e-6)
    assert any("recall at the review budget (top 0.50% of payments)" in r
               for r in (*report.decision.reasons, *report.decision.warnings))
    text = format_gate_report(report)
    assert "review budget: top 0.50% of payments (the challenger's operating points)" in text
    assert f"challenger v{new}: {points.describe()}" in text and f"champion v{old}: {champion_points.describe()}" in text
    stored = json.loads(next(v for k, v in tags.items() if k.startswith(GATE_TAG_PREFIX)))
    assert stored["review_budget"] == budget and stored["challenger_thresholds"]["holdout"]["recall"] == own.recall


def test_a_challenger_without_operating_points_is_judged_at_the_gates_fallback_budget(world, config, client):
    config = replace(config, gate=replace(config.gate, review_rate=0.05))
    with_champion(world, config, world.weak)
    new = register(world, config, "no-points", world.good)
    client.delete_model_version_tag(config.model_name, str(new), JSON_TAG)  # as a version registered before them
    report = run_gate(config)
    assert report.review_budget == 0.05 and report.budget_source.startswith("gate.review_rate")
    assert report.comparison.review_budget == 0.05 and report.challenger_thresholds is None
    assert any(f"challenger v{new} has no operating points" in n for n in report.notes)
    labels, frame = holdout_rows(world)
    assert report.challenger_metrics["recall_at_budget"] == pytest.approx(
        recall_at_rate(labels, factory.score(world.good, frame), 0.05))
    tags = client.get_model_version(config.model_name, str(new)).tags
    assert tags["gate.review_budget"] == "0.05" and "gate.expected_recall" not in tags
    assert "challenger v" in format_gate_report(report) and "no operating points" in format_gate_report(report)


def test_worse_challenger_is_rejected_and_champion_unchanged(world, config, client):
    champion = with_champion(world, config, world.good)
    worse = register(world, config, "worse", factory.inverted(world.good))
    report = run_gate(config)
    assert (report.outcome, report.exit_code) == (REJECTED, EXIT_REJECTED)
    assert any(r.startswith("AUC-ROC") and "below champion" in r for r in report.decision.reasons)
    assert alias(client, config, CHAMPION) == champion
    assert client.get_model_version(config.model_name, str(worse)).tags["gate.outcome"] == REJECTED
    assert [r.action for r in read_history(client, config.model_name)] == ["promote", "reject"]


@pytest.mark.parametrize("mode", ["block", "warn"])
def test_calibration_guardrail_blocks_or_warns(world, config, client, mode):
    """Same ranking as the champion (equal AUC passes), but badly calibrated (ECE ~0.12 > 0.1)."""
    config = replace(config, gate=replace(config.gate, ece_limit=Guardrail(0.1, mode)))
    champion = with_champion(world, config, world.good)
    challenger = register(world, config, "overconfident", factory.with_temperature(world.good, 0.2))
    report = run_gate(config)
    if mode == "block":
        assert report.outcome == REJECTED and alias(client, config, CHAMPION) == champion
        assert any("calibration: ECE" in r for r in report.decision.reasons)
    else:
        assert report.outcome == PROMOTED and alias(client, config, CHAMPION) == challenger
        assert any("calibration: ECE" in w for w in report.decision.warnings)


def test_too_few_holdout_frauds_is_insufficient_evidence(world, config, client):
    config = replace(config, gate=replace(config.gate, min_holdout_frauds=Guardrail(10_000, "block")))
    register(world, config, "first", world.good)
    report = run_gate(config)
    assert report.outcome == REJECTED
    frauds = factory.holdout_report(world.root, world.manifest, world.good)["n_fraud"]
    assert report.decision.reasons == (f"insufficient evidence: {frauds} frauds in the holdout, need 10000",)


def test_nan_scores_are_rejected(world, config, client):
    champion = with_champion(world, config, world.good)
    register(world, config, "nan", factory.with_nan_output(world.good))
    report = run_gate(config)
    assert report.outcome == REJECTED and report.challenger_metrics["nan_share"] == 1.0
    assert any(r.startswith("NaN scores") for r in report.decision.reasons)
    assert alias(client, config, CHAMPION) == champion


def test_rerunning_the_same_gate_repeats_the_decision_without_new_records(world, config, client):
    with_champion(world, config, world.good)
    register(world, config, "worse", factory.inverted(world.good))
    first = run_gate(config)
    again = run_gate(config)
    assert (again.outcome, again.replayed, again.decided_at) == (REJECTED, True, first.decided_at)
    assert again.challenger_metrics["auc_roc"] == pytest.approx(first.challenger_metrics["auc_roc"])
    assert [r.action for r in read_history(client, config.model_name)] == ["promote", "reject"]


def test_rerunning_after_a_promotion_finds_it_already_champion(world, config, client):
    version = register(world, config, "first", world.good)
    run_gate(config)
    again = run_gate(config)
    assert (again.outcome, again.exit_code, again.challenger_version) == (ALREADY_CHAMPION, EXIT_PROMOTED, version)
    assert len(read_history(client, config.model_name)) == 1


def test_a_promotion_undone_by_rollback_is_not_repeated_by_a_rerun(world, config, client):
    old = with_champion(world, config, world.weak)
    new = register(world, config, "better", world.good)
    assert run_gate(config).outcome == PROMOTED
    rollback(config, actor="oncall")
    again = run_gate(config)
    assert (again.outcome, again.exit_code, again.replayed) == (REJECTED, EXIT_REJECTED, True)
    assert "rolled back" in again.decision.reasons[0]
    assert alias(client, config, CHAMPION) == old and new != old
    assert [r.action for r in read_history(client, config.model_name)] == ["promote", "promote", "rollback"]


def test_corrupt_challenger_artifact_is_an_error_and_champion_unchanged(world, config, client):
    champion = with_champion(world, config, world.weak)
    broken = register(world, config, "broken", world.good)
    weights = next(version_artifact_dir(client, config.model_name, broken).rglob("model.safetensors"))
    weights.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match=f"models:/{config.model_name}/{broken}"):
        run_gate(config)
    assert alias(client, config, CHAMPION) == champion
    assert [r.action for r in read_history(client, config.model_name)] == ["promote"]


def test_dataset_without_a_signature_column_is_an_error(world, config, client):
    champion = with_champion(world, config, world.weak)
    register(world, config, "challenger", world.good)
    other_root = world.tmp / f"{config.model_name}-v2-features"
    later = factory.write_dataset(other_root, start="2024-03-09", drop_numeric="merchant_fraud_rate_7d")
    assert "merchant_fraud_rate_7d" not in later.numeric_features
    with pytest.raises(SignatureMismatch, match="merchant_fraud_rate_7d"):
        run_gate(config, dataset_root=other_root)
    assert alias(client, config, CHAMPION) == champion


def test_holdout_overlapping_the_challengers_training_data_is_refused(world, config):
    register(world, config, "challenger", world.good)
    earlier_root = world.tmp / f"{config.model_name}-earlier"
    factory.write_dataset(earlier_root, start="2024-02-25")  # test split 03-02..03-03 = challenger's train
    with pytest.raises(HoldoutError, match="overlaps the challenger's training data"):
        run_gate(config, dataset_root=earlier_root)


def test_no_challenger_is_an_error(config):
    with pytest.raises(NoChallenger, match="fraudctl register"):
        run_gate(config)


def test_unreachable_tracking_server_fails_fast_with_a_clear_error(config):
    config = replace(config, tracking_uri=f"http://127.0.0.1:{free_port()}", connect_timeout_s=2)
    with pytest.raises(TrackingUnavailable, match="unreachable"):
        run_gate(config)
