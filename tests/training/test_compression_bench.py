"""The compression benchmark's figures: means over seeds, paired deltas against dense, the goals and
the comparison with PowerSGD."""

from __future__ import annotations

import pytest

from pipeline.bench.compression import (
    GOALS,
    TOPK_EF_GOALS,
    Goal,
    comm_wait_share,
    compare_with_powersgd,
    summarize,
)


def _row(seed: int, auc: float, ap: float, sent: float, all_steps: float | None = None) -> dict:
    return {"seed": seed, "auc": auc, "average_precision": ap, "bytes_per_step": sent,
            "bytes_per_step_all_steps": all_steps or sent, "bytes_dense_per_step": 1000.0}


def test_summary_takes_means_and_paired_deltas_and_judges_the_goal():
    table = summarize({
        "dense": [_row(1, 0.90, 0.50, 1000.0), _row(2, 0.92, 0.40, 1000.0)],
        "sparse": [_row(1, 0.899, 0.49, 2.5, 50.0), _row(2, 0.918, 0.40, 2.5, 50.0)],
        "lossy": [_row(1, 0.90, 0.45, 2.5), _row(2, 0.92, 0.38, 2.5)],
    })
    sparse = table["sparse"]
    assert sparse["bytes_ratio"]["mean"] == 400.0 and sparse["bytes_ratio_all_steps"]["mean"] == 20.0
    assert sparse["auc"]["mean"] == pytest.approx(0.9085)
    assert sparse["auc_delta_vs_dense"]["mean"] == pytest.approx(-0.0015)
    assert sparse["average_precision_delta_vs_dense"]["mean"] == pytest.approx(-0.005)
    assert sparse["average_precision_delta_vs_dense"]["std"] == pytest.approx(0.00707107, rel=1e-5)  # of -0.01, 0
    assert sparse["average_precision_delta_vs_dense_per_seed"] == pytest.approx([-0.01, 0.0])
    goal = Goal("sparse", 300.0, 0.002, 0.01)
    assert goal.met(sparse)
    assert not goal.met(table["lossy"])  # AP 0.035 below dense
    assert not goal.met(table["dense"])  # no fewer bytes
    assert not Goal("sparse", 300.0, 0.002, 0.01, bytes_ratio_all_steps=100.0).met(sparse)  # 20x over the run


def test_the_issue_goals_are_the_ones_stated():
    topk_int8 = GOALS["topk_int8_ef"]
    assert (topk_int8.bytes_ratio, topk_int8.bytes_ratio_all_steps) == (1000.0, 100.0)
    assert (topk_int8.auc_loss, topk_int8.ap_loss) == (0.002, 0.01)
    assert (GOALS["int8_ef"].auc_loss, GOALS["int8_ef"].ap_loss) == (0.001, 0.005)
    assert all(goal.bytes_ratio == 300.0 for goal in TOPK_EF_GOALS)
    assert "100x over the whole run" in topk_int8.describe()


def test_our_hook_beats_powersgd_only_with_fewer_bytes_and_no_worse_quality():
    table = summarize({
        "dense": [_row(1, 0.90, 0.50, 1000.0), _row(2, 0.90, 0.50, 1000.0)],
        "powersgd_r1": [_row(1, 0.90, 0.50, 20.0), _row(2, 0.90, 0.50, 20.0)],
        "powersgd_r2": [_row(1, 0.90, 0.50, 0.5), _row(2, 0.90, 0.50, 0.5)],
        "topk_int8_ef": [_row(1, 0.8995, 0.497, 0.8, 8.0), _row(2, 0.8995, 0.497, 0.8, 8.0)],
        "int8_ef": [_row(1, 0.90, 0.47, 250.0), _row(2, 0.90, 0.49, 250.0)],
    })
    verdict = compare_with_powersgd(table)
    r1 = verdict["topk_int8_ef"]["powersgd_r1"]
    assert {k: r1[k] for k in ("fewer_bytes", "quality_at_least_equal", "beats", "why_not")} == {
        "fewer_bytes": True, "quality_at_least_equal": True, "beats": True, "why_not": ""}  # within the tie
    assert r1["paired"]["average_precision"]["mean"] == pytest.approx(-0.003)
    r2 = verdict["topk_int8_ef"]["powersgd_r2"]  # 0.5 bytes a step after the warm-ups beats our 0.8
    assert not r2["fewer_bytes"] and not r2["beats"] and "more bytes" in r2["why_not"]
    int8 = verdict["int8_ef"]["powersgd_r1"]
    assert not int8["quality_at_least_equal"] and "lower average_precision" in int8["why_not"]
    assert "paired by seed -0.0200 +- 0.0141" in int8["why_not"]  # -0.03 and -0.01 against PowerSGD's 0.50
    assert "topk_ef" not in verdict  # variants not run are left out


def testcomm_wait_share_sums_epochs_from_the_first_after_the_warmups():
    epochs = [{"epoch": 0, "step_s": 10.0, "comm_wait_s": 5.0}, {"epoch": 1, "step_s": 10.0, "comm_wait_s": 1.0},
              {"epoch": 2, "step_s": 10.0, "comm_wait_s": 2.0}]
    assert comm_wait_share(epochs, 0, 100.0) == pytest.approx(8.0 / 30.0)
    assert comm_wait_share(epochs, 60, 100.0) == pytest.approx(3.0 / 20.0)  # epoch 0 holds the warm-up


def test_one_run_reads_bytes_timings_and_the_variants_own_warmups(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from pipeline.bench import compression as bench
    from pipeline.training.run_dir import RunDir

    seen = {}

    def fake_training(workdir, name, root, nproc, overrides):
        seen.update(overrides["compression"])
        run = RunDir(workdir / name)
        for epoch, wait in enumerate((4.0, 1.0)):
            run.append_epoch({"epoch": epoch, "step": 100 * (epoch + 1), "step_s": 10.0, "comm_wait_s": wait,
                              "buckets_per_step": 1.0})
        steps = [{"step": s, "bytes_sent": 1000 if s <= 10 else 50 if s <= 60 else 2} for s in range(1, 201)]
        summary = SimpleNamespace(global_step=200, bytes_sent_total=10 * 1000 + 50 * 50 + 140 * 2,
                                  bytes_dense_total=200 * 4000,
                                  train_samples=1000, train_samples_per_s=50.0, best_epoch=1, wall_s=30.0)
        return summary, steps

    monkeypatch.setattr(bench, "run_bench_training", fake_training)
    monkeypatch.setattr(bench, "score_frame", lambda run, frame: None)
    monkeypatch.setattr(bench, "holdout_metrics", lambda holdout, scores: {"auc_roc": 0.9, "average_precision": 0.5})
    monkeypatch.setattr(bench, "EPOCHS", {True: 2, False: 2})
    variant = next(v for v in bench.VARIANTS if v.name == "topk_int8_ef")
    row = bench._train_and_score(tmp_path, variant, 1, tmp_path, SimpleNamespace(frame=None), quick=True)
    assert seen["dense_warmup_exchange"] == "int8" and seen["density_warmup_start"] == 0.1  # the cheap warm-ups
    assert seen["density_warmup_epochs"] == 0.5 and seen["method"] == "topk_int8_ef" and seen["density"] == 0.001
    # Warm-ups: 10 dense steps + 0.5 of a 100-step epoch = 60; steps 61..200 are the steady ones.
    assert row["bytes_per_step"] == 2.0
    assert row["bytes_per_step_all_steps"] == pytest.approx((10 * 1000 + 50 * 50 + 140 * 2) / 200)
    assert row["bytes_dense_per_step"] == 4000 and row["train_s"] == 20.0
    assert row["comm_wait_share"] == pytest.approx(5.0 / 20.0)
    assert row["comm_wait_share_after_warmups"] == pytest.approx(1.0 / 10.0)  # epoch 1 starts at step 100
