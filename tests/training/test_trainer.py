"""The whole job end to end: torchrun, 2 gloo processes, compression and accumulation on.

A reference run goes through ``fraudctl train``; the fault runs go through the Python API
(``run_training``). Final parameters are compared bit for bit through the last step checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from models.fraud_mlp import load_model
from pipeline.datasets.manifest import load_manifest
from pipeline.features import definitions as fd
from pipeline.training.checkpoint import TRAINER_FILE, load_tensor_file, rank_file
from pipeline.training.export import export_model_from_checkpoint
from pipeline.training.launch import Torchrun, TrainingJobFailed, run_training
from pipeline.training.run_dir import RunDir
from pipeline.training.trainer import sequence_branch
from tests.training.dataset_factory import write_conf_dir

pytestmark = pytest.mark.slow

# 2 ranks x 2 micro-batches of 64 rows: 9 steps per epoch, 18 in all; checkpoints every 4 steps.
JOB = {"optim": {"accumulation_steps": 2}}
TOTAL_STEPS = 18
KILL = {"faults": {"sigkill_rank": 1, "sigkill_at_step": 7}}  # after the step-4 checkpoint, mid-epoch


def _fraudctl(args: list[str], conf: Path, state: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FRAUD_CONF_DIR": str(conf), "FRAUD_STATE_DIR": str(state)}
    command = [sys.executable, "-c", "from pipeline.cli.main import cli; cli()", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _final_state(run_dir: Path) -> tuple[dict, list[dict]]:
    final = run_dir / "checkpoints" / f"step-{TOTAL_STEPS:08d}"
    trainer = load_tensor_file(final / TRAINER_FILE)
    ranks = [load_tensor_file(final / rank_file(r)) for r in range(2)]
    return trainer, ranks


def _assert_identical(a: Path, b: Path) -> None:
    trainer_a, ranks_a = _final_state(a)
    trainer_b, ranks_b = _final_state(b)
    model_a, model_b = trainer_a["model"], trainer_b["model"]  # the weight average (optim.ema_decay)
    assert model_a.keys() == model_b.keys()
    for key in model_a:
        assert torch.equal(model_a[key], model_b[key]), f"parameter {key} differs"
    raw_a, raw_b = trainer_a["training_params"], trainer_b["training_params"]  # the weights training continues from
    # Every parameter: the state dict less its buffers (num_mean, num_std, temperature, bin_edges).
    assert len(raw_a) == len(raw_b) == len(model_a) - 4
    assert all(torch.equal(x, y) for x, y in zip(raw_a, raw_b, strict=True))
    for ra, rb in zip(ranks_a, ranks_b, strict=True):
        assert ra["residuals"].keys() == rb["residuals"].keys()
        for name in ra["residuals"]:
            assert torch.equal(ra["residuals"][name], rb["residuals"][name]), f"residual {name} differs"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("train-e2e")


@pytest.fixture(scope="module")
def reference(workdir: Path, tiny_dataset: Path) -> tuple[Path, subprocess.CompletedProcess]:
    conf = write_conf_dir(workdir / "conf-ref", JOB)
    proc = _fraudctl(["train", "--nproc", "2", "--run-name", "ref", "--dataset-root", str(tiny_dataset),
                      "--max-restarts", "0"], conf, workdir / "state")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return workdir / "state" / "runs" / "ref", proc


def test_cli_prints_metrics_bytes_saved_and_checkpoint_location(reference):
    run_dir, proc = reference
    assert "validation (best epoch" in proc.stdout and "average_precision" in proc.stdout
    assert "gradient traffic per rank" in proc.stdout and "x less, topk_ef" in proc.stdout
    assert f"checkpoints: {run_dir / 'checkpoints'}" in proc.stdout
    assert "step 18/18" in proc.stdout  # rank-0 progress lines
    assert re.search(r"registered fraud-detector v\d+ as challenger", proc.stdout)


def test_run_directory_follows_the_contract(reference, tiny_dataset):
    run_dir, _ = reference
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["run_name"] == "ref"
    assert summary["global_step"] == TOTAL_STEPS and summary["epochs"] == 2 and summary["world_size"] == 2
    assert summary["compression"] == {"method": "topk_ef", "density": 0.05}
    assert summary["bytes_dense_total"] > summary["bytes_sent_total"] > 0
    # The synthetic signal is being learnt: 18 steps of conf/dev's 4-member model reach ~0.59 (one
    # member ~0.69: the members' random-sign adapters start slower); an untrained model scores ~0.5.
    assert summary["best_metrics"]["auc_roc"] > 0.55
    assert summary["peak_rss_mb"] > 0 and summary["stopped_early"] is False
    config = json.loads((run_dir / "config.json").read_text())
    assert config["world_size"] == 2 and config["backend"] == "gloo" and config["optim"]["accumulation_steps"] == 2
    manifest = load_manifest(tiny_dataset)
    published = tiny_dataset / "manifests" / f"{manifest.version}.json"
    assert (run_dir / "dataset.json").read_bytes() == published.read_bytes()
    assert Path((run_dir / "dataset_root.txt").read_text().strip()) == tiny_dataset.resolve()
    steps = RunDir(run_dir).read_steps()
    assert [s["step"] for s in steps] == list(range(1, TOTAL_STEPS + 1))
    assert set(steps[0]) == {"step", "epoch", "loss", "lr", "density", "bytes_sent", "bytes_dense",
                             "samples_per_s", "skipped_steps", "time"}
    assert steps[0]["density"] == 1.0 and steps[-1]["density"] == pytest.approx(0.05)
    assert steps[-1]["bytes_sent"] < steps[0]["bytes_sent"]  # sparse after the dense warm-up
    epochs = RunDir(run_dir).read_epochs()
    assert [e["epoch"] for e in epochs] == [0, 1]
    assert {"val_loss", "auc_roc", "average_precision", "recall_at_1pct_fpr", "card_precision_at_100",
            "ece"} <= set(epochs[0])
    scores = pq.read_table(run_dir / "validation_scores.parquet")
    assert scores.column_names == ["transaction_id", "card_id", "event_time", "score", "label"]
    assert scores.num_rows == sum(s.rows for s in manifest.shards_for("validation"))
    assert (run_dir / "checkpoints" / "best" / "calibration.pt").is_file()
    assert len(list((run_dir / "checkpoints").glob("step-*"))) == 2  # keep_last


def test_exported_best_checkpoint_is_the_run_model(reference, tmp_path):
    run_dir, _ = reference
    exported = load_model(export_model_from_checkpoint(run_dir / "checkpoints" / "best", tmp_path / "m"))
    model = load_model(run_dir / "model")
    for key, value in model.state_dict().items():
        assert torch.equal(exported.state_dict()[key], value)
    assert model.temperature.item() == pytest.approx(json.loads((run_dir / "summary.json").read_text())["temperature"])


def test_worker_sigkill_restarts_resumes_and_ends_bit_identical(reference, workdir, tiny_dataset):
    conf = write_conf_dir(workdir / "conf-kill", {**JOB, **KILL})
    run_dir = workdir / "elastic"
    # Spare restarts: gloo's re-rendezvous after a kill can itself fail transiently on a loaded host
    # ("connectFullMesh ... connection refused"); absorbing that is what elastic restarts are for.
    log = workdir / "elastic.log"
    summary = run_training(None, run_dir, tiny_dataset, Torchrun(nproc_per_node=2, max_restarts=3),
                           config_path=conf / "train.toml", log_file=log, timeout_s=300)
    output = log.read_text()
    assert "fault injection: SIGKILL at step 7" in output
    assert "resumed from" in output and "step-00000004" in output
    assert summary.completed and summary.global_step == TOTAL_STEPS
    assert [s["step"] for s in RunDir(run_dir).read_steps()] == list(range(1, TOTAL_STEPS + 1))
    _assert_identical(reference[0], run_dir)


def test_killed_run_fails_then_resumes_to_identical_parameters(reference, workdir, tiny_dataset):
    conf = write_conf_dir(workdir / "conf-kill2", {**JOB, **KILL})
    run_dir = workdir / "resumed"
    with pytest.raises(TrainingJobFailed, match="exited with code"):
        run_training(None, run_dir, tiny_dataset, Torchrun(nproc_per_node=2), config_path=conf / "train.toml",
                     log_file=workdir / "killed.log")
    assert not (run_dir / "summary.json").exists()
    # TORCHELASTIC_RESTART_COUNT is 0 again in a new launch, so the kill must be switched off to resume.
    clean = write_conf_dir(workdir / "conf-resume", JOB)
    summary = run_training(None, run_dir, tiny_dataset, Torchrun(nproc_per_node=2), config_path=clean / "train.toml",
                           log_file=workdir / "resumed.log")
    assert summary.global_step == TOTAL_STEPS
    _assert_identical(reference[0], run_dir)


def test_a_nan_loss_step_is_skipped_counted_and_parameters_stay_finite(workdir, tiny_dataset):
    conf = write_conf_dir(workdir / "conf-nan", {**JOB, "faults": {"nan_loss_at_steps": [5]}})
    run_dir = workdir / "nan-once"
    log = workdir / "nan-once.log"
    summary = run_training(None, run_dir, tiny_dataset, Torchrun(nproc_per_node=2), config_path=conf / "train.toml",
                           log_file=log)
    assert summary.skipped_steps == 1
    assert "step 5: non-finite loss or gradient, step skipped" in log.read_text()
    steps = RunDir(run_dir).read_steps()
    assert [s["skipped_steps"] for s in steps if s["step"] in (5, 6)] == [0, 1]
    trainer, _ = _final_state(run_dir)
    assert all(torch.isfinite(t).all() for t in [*trainer["model"].values(), *trainer["training_params"]])


def test_consecutive_nan_steps_stop_the_job_with_a_clear_error(workdir, tiny_dataset):
    conf = write_conf_dir(workdir / "conf-nan3", {**JOB, "faults": {"nan_loss_at_steps": [3, 4, 5]},
                                                  "loop": {"max_consecutive_skips": 3}})
    proc = _fraudctl(["train", "--nproc", "2", "--run-name", "diverged", "--dataset-root", str(tiny_dataset),
                      "--max-restarts", "0"], conf, workdir / "state")
    assert proc.returncode == 1
    assert "TrainingDiverged: 3 consecutive steps had a non-finite loss" in proc.stderr
    assert not (workdir / "state" / "runs" / "diverged" / "summary.json").exists()


def test_a_missing_dataset_is_a_clear_cli_error(workdir):
    conf = write_conf_dir(workdir / "conf-missing", JOB)
    proc = _fraudctl(["train", "--nproc", "1", "--run-name", "nodata", "--dataset-root", str(workdir / "none"),
                      "--max-restarts", "0"], conf, workdir / "state")
    assert proc.returncode == 1
    assert "no published dataset" in proc.stderr and "fraudctl ingest" in proc.stderr


def test_a_negative_sampled_run_trains_two_ranks_on_every_fraud_and_a_tenth_of_the_rest(reference, workdir, tiny_dataset):
    conf = write_conf_dir(workdir / "conf-sampled", {**JOB, "data": {"negative_sample_rate": 0.1}})
    run_dir = workdir / "sampled"
    sampled = run_training(None, run_dir, tiny_dataset, Torchrun(nproc_per_node=2), config_path=conf / "train.toml",
                           log_file=workdir / "sampled.log")
    full = RunDir(reference[0]).read_summary()
    # 9 steps an epoch on every row; about 1 on the frauds and a tenth of the genuine rows.
    assert sampled.completed and sampled.epochs == full.epochs and 0 < sampled.global_step <= 0.25 * full.global_step
    assert json.loads((run_dir / "config.json").read_text())["data"]["negative_sample_rate"] == 0.1


def test_validation_every_kth_epoch_and_the_last(workdir, tiny_dataset):
    """[loop] validate_every_epochs = 2 over 3 epochs validates after epochs 1 and 2 (the last) only,
    and the exported best weights come from a validated epoch."""
    conf = write_conf_dir(workdir / "conf-every2", {**JOB, "loop": {"epochs": 3, "validate_every_epochs": 2}})
    run_dir = workdir / "every2"
    summary = run_training(None, run_dir, tiny_dataset, Torchrun(nproc_per_node=2), config_path=conf / "train.toml",
                           log_file=workdir / "every2.log")
    validated = [json.loads(line)["epoch"] for line in RunDir(run_dir).epochs.read_text().splitlines()]
    assert summary.completed and summary.epochs == 3
    assert validated == [1, 2] and summary.best_epoch in validated


def test_a_sampled_run_takes_its_own_epochs_validation_period_and_validation_sample(workdir, tiny_dataset):
    """With negative_sample_rate < 1, [loop] sampled_epochs, sampled_validate_every_epochs and
    sampled_validation_negative_rate replace epochs (2 here), validate_every_epochs (1) and
    validation_negative_rate (1): each validation scores every validation fraud and a quarter of the
    genuine rows, while finalisation calibrates on the whole split."""
    conf = write_conf_dir(workdir / "conf-sampled-loop", {
        **JOB, "data": {"negative_sample_rate": 0.1},
        "loop": {"sampled_epochs": 3, "sampled_validate_every_epochs": 2, "sampled_validation_negative_rate": 0.25}})
    run_dir = workdir / "sampled-loop"
    summary = run_training(None, run_dir, tiny_dataset, Torchrun(nproc_per_node=2), config_path=conf / "train.toml",
                           log_file=workdir / "sampled-loop.log")
    epochs = [json.loads(line) for line in RunDir(run_dir).epochs.read_text().splitlines()]
    assert summary.completed and summary.epochs == 3 and [e["epoch"] for e in epochs] == [1, 2]
    assert all(e["validation_negative_rate"] == 0.25 and "card_precision_at_100" not in e for e in epochs)
    shards = load_manifest(tiny_dataset).shards_for("validation")
    assert summary.validation_rows == sum(s.rows for s in shards)  # finalisation: every validation row
    assert "every fraud and 0.25 of the genuine rows, weighted" in (workdir / "sampled-loop.log").read_text()


def test_a_validation_with_too_few_frauds_runs_every_epoch_and_exports_the_last(workdir, tiny_dataset):
    """[loop] min_validation_frauds one above the tiny dataset's validation frauds: with patience 1 from
    epoch 1, validation would stop a run at its first flat epoch; here none stops or picks, and
    summary.json says why the last epoch was exported."""
    frauds = sum(s.frauds for s in load_manifest(tiny_dataset).shards_for("validation"))
    conf = write_conf_dir(workdir / "conf-few-frauds", {**JOB, "loop": {
        "epochs": 3, "early_stop_patience": 1, "min_epochs": 1, "min_validation_frauds": frauds + 1}})
    run_dir = workdir / "few-frauds"
    summary = run_training(None, run_dir, tiny_dataset, Torchrun(nproc_per_node=2), config_path=conf / "train.toml",
                           log_file=workdir / "few-frauds.log")
    validated = [json.loads(line)["epoch"] for line in RunDir(run_dir).epochs.read_text().splitlines()]
    assert summary.completed and summary.epochs == 3 and validated == [0, 1, 2]
    assert summary.best_epoch == 2 and not summary.stopped_early
    assert summary.epoch_picked_by == (f"the schedule's end: validation holds {frauds} frauds, "
                                       f"fewer than loop.min_validation_frauds {frauds + 1}")
    assert "not picked: too few validation frauds" in (workdir / "few-frauds.log").read_text()


def test_the_sequence_branch_is_built_only_for_datasets_that_have_the_cards_last_payments():
    with_sequence = sequence_branch(fd.NUMERIC_FEATURES, 32)
    assert with_sequence == {"sequence_columns": fd.SEQUENCE_FEATURES, "sequence_steps": fd.SEQUENCE_STEPS,
                             "sequence_hidden": 32}
    before_version_4 = tuple(n for n in fd.NUMERIC_FEATURES if n not in fd.SEQUENCE_FEATURES[-1:])
    assert sequence_branch(before_version_4, 32) == {"sequence_columns": (), "sequence_steps": 0, "sequence_hidden": 0}
