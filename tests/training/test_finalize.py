"""finalize_run in one process: from a best checkpoint to the calibrated model, scores and summary."""

from __future__ import annotations

import time

import pyarrow.parquet as pq
import pytest
import torch

from models.fraud_mlp import FraudModel, FraudModelConfig, load_model
from pipeline.decisions.operating_points import DecisionBudget, choose_operating_points, read_operating_points
from pipeline.training import finalize as finalize_module
from pipeline.training.checkpoint import CALIBRATION_FILE, Checkpointer, load_tensor_file
from pipeline.training.config import CompressionConfig, OptimConfig
from pipeline.training.finalize import TrainingOutcome, finalize_run
from pipeline.training.loss import make_loss
from pipeline.training.run_dir import RunDir, RunSummary


def _loss(manifest):
    frauds = sum(s.frauds for s in manifest.shards_for("train"))
    return make_loss(OptimConfig(), frauds, sum(s.rows for s in manifest.shards_for("train")) - frauds)


def _outcome(started_at: float) -> TrainingOutcome:
    return TrainingOutcome(
        global_step=6, epochs=2, best_epoch=1, best_metrics={}, stopped_early=False, skipped_steps=1,
        bytes_sent_total=100, bytes_dense_total=4_000, train_samples=1_536, loop_seconds=3.0,
        rank_stats=[{"peak_rss_mb": 500.0, "loop_cpu_s": 2.0}, {"peak_rss_mb": 520.0, "loop_cpu_s": 2.5}],
        world_size=2, backend="gloo", compression=CompressionConfig(method="allreduce"), started_at=started_at)


@pytest.fixture
def finalized(tmp_path, tiny_dataset, tiny_manifest):
    torch.manual_seed(0)
    model = FraudModel(FraudModelConfig(tiny_manifest.numeric_features, dict(tiny_manifest.categorical_features),
                                        embedding_dim=2, hidden_dim=8, num_blocks=1))
    run = RunDir(tmp_path / "run")
    checkpointer = Checkpointer(run.checkpoints, rank=0, world_size=1, keep_last=2, barrier=lambda: None)
    checkpointer.save(6, 1, {"model": model.state_dict()}, {}, model.config.to_json(), is_best=True)
    started = time.time() - 30.0
    returned = finalize_run(run, checkpointer, tiny_dataset, tiny_manifest, _loss(tiny_manifest), _outcome(started),
                            DecisionBudget())
    return run, checkpointer, returned, started


def test_the_summary_written_last_is_the_one_returned(finalized, tiny_manifest):
    run, _, returned, started = finalized
    assert run.read_summary() == returned
    assert returned.completed and returned.run_name == "run"
    assert returned.started_at == started and returned.finished_at >= started + 30.0
    assert returned.wall_s == pytest.approx(returned.finished_at - started, abs=1e-3)
    assert returned.compression.density is None  # no density for dense all-reduce
    assert (returned.peak_rss_mb, returned.peak_rss_mb_per_rank) == (520.0, (500.0, 520.0))
    assert returned.train_samples_per_s == pytest.approx(512.0)
    assert (returned.dataset.version, returned.dataset.content_hash) == (tiny_manifest.version,
                                                                         tiny_manifest.content_hash)


def test_without_validation_the_calibrated_metrics_are_the_best_metrics(finalized):
    _, _, returned, _ = finalized
    assert set(returned.best_metrics) >= {"auc_roc", "average_precision", "ece", "val_loss"}
    assert returned.best_metrics["ece"] == returned.calibrated_ece


def test_model_scores_and_calibration_agree_with_the_summary(finalized, tiny_manifest):
    run, checkpointer, returned, _ = finalized
    assert load_model(run.model).temperature.item() == pytest.approx(returned.temperature)
    stored = load_tensor_file(checkpointer.best / CALIBRATION_FILE)
    assert float(stored["logit_shift"]) == pytest.approx(returned.logit_shift)
    rows = sum(s.rows for s in tiny_manifest.shards_for("validation"))
    assert pq.read_metadata(run.validation_scores).num_rows == returned.validation_rows == rows


def test_finalizing_again_after_a_kill_gives_the_same_run(finalized, tiny_dataset, tiny_manifest):
    run, checkpointer, first, _ = finalized
    run.summary.unlink()  # as if killed just before summary.json
    again = finalize_run(run, checkpointer, tiny_dataset, tiny_manifest, _loss(tiny_manifest),
                         _outcome(first.started_at), DecisionBudget())
    assert (again.temperature, again.logit_shift) == (first.temperature, first.logit_shift)
    assert RunSummary.from_json(run.summary.read_text()) == again


def test_the_model_ships_the_operating_points_of_the_budget_chosen_on_its_validation_scores(finalized):
    run, _, _, _ = finalized
    points = read_operating_points(run.model)
    assert points is not None and points.budget == DecisionBudget() and points.chosen_on == "validation"
    scores = pq.read_table(run.validation_scores).to_pandas()
    # They are the thresholds of the calibrated scores the run wrote, at the budget: recomputed here.
    again = choose_operating_points(scores["label"].to_numpy(), scores["score"].to_numpy(), DecisionBudget())
    assert (points.review_threshold, points.block_threshold) == (again.review_threshold, again.block_threshold)
    flagged = (scores["score"] >= points.review_threshold).mean()
    assert points.validation.review_rate == pytest.approx(flagged)
    assert flagged >= DecisionBudget().review_rate and points.review_threshold <= points.block_threshold


def test_a_finalisation_that_fails_midway_leaves_model_dir_as_it_was(finalized, tiny_dataset, tiny_manifest,
                                                                    monkeypatch):
    """model/ is published whole: weights never appear there without the thresholds chosen for them."""
    run, checkpointer, first, _ = finalized
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in run.model.iterdir()}

    def fail(*args, **kwargs):
        raise MemoryError("killed while choosing the operating points")

    monkeypatch.setattr(finalize_module, "choose_operating_points", fail)
    with pytest.raises(MemoryError):
        finalize_run(run, checkpointer, tiny_dataset, tiny_manifest, _loss(tiny_manifest),
                     _outcome(first.started_at), DecisionBudget())
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in run.model.iterdir()} == before
    assert not [p.name for p in run.model.parent.iterdir() if p.name.startswith(".")]
