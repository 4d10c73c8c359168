"""The whole job with the new exchanges: torchrun, 2 gloo processes, top-k with int8 values (its warm-up
int8 too) and PowerSGD. A killed top-k int8 run resumes to the bits of an uninterrupted one, and the
epoch records carry the communication timings the compression bench reports."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.training.checkpoint import TRAINER_FILE, load_tensor_file, rank_file
from pipeline.training.launch import Torchrun, TrainingJobFailed, run_training
from pipeline.training.run_dir import RunDir
from tests.training.dataset_factory import write_conf_dir

pytestmark = pytest.mark.slow

TOTAL_STEPS = 18  # 2 ranks x 2 micro-batches of 64 rows: 9 steps an epoch (tests/training/test_trainer.py)
TOPK_INT8 = {"optim": {"accumulation_steps": 2},
             "compression": {"method": "topk_int8_ef", "dense_warmup_exchange": "int8", "quantization_chunk": 64}}
KILL = {"faults": {"sigkill_rank": 1, "sigkill_at_step": 7}}  # after the step-4 checkpoint, mid-epoch


def _train(workdir: Path, dataset: Path, name: str, overrides: dict) -> object:
    conf = write_conf_dir(workdir / f"conf-{name}", overrides)
    return run_training(None, workdir / name, dataset, Torchrun(nproc_per_node=2), config_path=conf / "train.toml",
                        log_file=workdir / f"{name}.log", timeout_s=300)


def _final_state(run_dir: Path) -> tuple[dict, list[dict]]:
    final = run_dir / "checkpoints" / f"step-{TOTAL_STEPS:08d}"
    return load_tensor_file(final / TRAINER_FILE), [load_tensor_file(final / rank_file(r)) for r in range(2)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("train-int8")


@pytest.fixture(scope="module")
def reference(workdir: Path, tiny_dataset: Path) -> tuple[Path, object]:
    return workdir / "ref", _train(workdir, tiny_dataset, "ref", TOPK_INT8)


def test_topk_int8_run_counts_its_bytes_and_records_communication_timings(reference):
    run_dir, summary = reference
    assert summary.global_step == TOTAL_STEPS and summary.compression.method == "topk_int8_ef"
    steps = RunDir(run_dir).read_steps()
    # Step 1 is an int8 warm-up step: about a quarter of the fp32 bytes; the last ones are sparse.
    assert 3.5 < steps[0]["bytes_dense"] / steps[0]["bytes_sent"] < 4
    assert steps[-1]["bytes_dense"] / steps[-1]["bytes_sent"] > 10
    epochs = RunDir(run_dir).read_epochs()
    for epoch in epochs:
        assert 0 <= epoch["comm_wait_share"] < 1 and epoch["comm_wait_s"] >= 0 and epoch["step_s"] > 0
        assert epoch["comm_wait_clock"] == "host"  # gloo: its collectives finish on the host
        assert epoch["buckets_per_step"] >= 1 and epoch["bucket_cap_mb"] == 25.0


def test_a_killed_topk_int8_run_resumes_to_identical_parameters_and_residuals(reference, workdir, tiny_dataset):
    with pytest.raises(TrainingJobFailed, match="exited with code"):
        _train(workdir, tiny_dataset, "killed", {**TOPK_INT8, **KILL})
    conf = write_conf_dir(workdir / "conf-resume", TOPK_INT8)  # the kill switched off, as a new launch needs
    summary = run_training(None, workdir / "killed", tiny_dataset, Torchrun(nproc_per_node=2),
                           config_path=conf / "train.toml", log_file=workdir / "resumed.log", timeout_s=300)
    assert summary.global_step == TOTAL_STEPS
    (trainer_a, ranks_a), (trainer_b, ranks_b) = _final_state(reference[0]), _final_state(workdir / "killed")
    assert all(torch.equal(x, y) for x, y in zip(trainer_a["training_params"], trainer_b["training_params"],
                                                 strict=True))
    for ra, rb in zip(ranks_a, ranks_b, strict=True):
        assert ra["residuals"].keys() == rb["residuals"].keys() and ra["residuals"]
        assert all(torch.equal(ra["residuals"][n], rb["residuals"][n]) for n in ra["residuals"])


def test_powersgd_trains_with_fewer_bytes_after_its_warmup(workdir, tiny_dataset):
    summary = _train(workdir, tiny_dataset, "powersgd", {"optim": {"accumulation_steps": 2},
                                                         "compression": {"method": "powersgd", "powersgd_rank": 2}})
    assert summary.global_step == TOTAL_STEPS and summary.skipped_steps == 0
    steps = RunDir(workdir / "powersgd").read_steps()
    assert steps[0]["bytes_sent"] == steps[0]["bytes_dense"]  # dense warm-up
    assert steps[-1]["bytes_sent"] < steps[-1]["bytes_dense"] / 2
