"""The run-directory contract: RunSummary's strict JSON form and RunDir's files (one process, no MLflow)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from models.fraud_mlp import FraudModel, FraudModelConfig
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.run_dir import (
    CompressionSummary,
    DatasetRef,
    RunDir,
    RunSummary,
    RunSummaryError,
    read_summary,
)

SUMMARY = RunSummary(
    status="completed", run_name="r1", global_step=40, epochs=2, best_epoch=1,
    best_metrics={"auc_roc": 0.91, "average_precision": 0.4, "val_loss": 0.2},
    temperature=1.3, bytes_sent_total=1_000, bytes_dense_total=50_000,
    compression=CompressionSummary("topk_ef", 0.01), world_size=2, wall_s=12.5, peak_rss_mb=700.0,
    stopped_early=False, started_at=1_717_000_000.0, finished_at=1_717_000_012.5, logit_shift=-0.2,
    calibrated_ece=0.01, backend="gloo", peak_rss_mb_per_rank=(700.0, 650.0), train_cpu_s_per_rank=(3.0, 2.9),
    train_samples=10_240, train_samples_per_s=float("nan"), skipped_steps=0, checkpoint_dir="/r/checkpoints",
    model_dir="/r/model", dataset=DatasetRef("transactions", "v-abc", "ab" * 32), validation_rows=600,
)


def test_summary_json_round_trip_keeps_every_field_and_nan():
    back = RunSummary.from_json(SUMMARY.to_json())
    assert math.isnan(back.train_samples_per_s)
    assert replace(back, train_samples_per_s=0.0) == replace(SUMMARY, train_samples_per_s=0.0)
    assert isinstance(back.compression, CompressionSummary) and isinstance(back.dataset, DatasetRef)


def test_summary_keeps_the_json_keys_that_readers_of_the_dict_use():
    written = json.loads(SUMMARY.to_json())
    assert written["compression"] == {"method": "topk_ef", "density": 0.01}
    assert written["dataset"]["content_hash"] == "ab" * 32 and written["peak_rss_mb_per_rank"] == [700.0, 650.0]


def test_a_summary_without_the_later_fields_still_reads():
    required = {k: v for k, v in json.loads(SUMMARY.to_json()).items()
                if k in ("status", "run_name", "global_step", "epochs", "best_epoch", "best_metrics", "temperature",
                         "bytes_sent_total", "bytes_dense_total", "compression", "world_size", "wall_s",
                         "peak_rss_mb", "stopped_early")}
    summary = RunSummary.from_json(json.dumps(required))
    assert (summary.started_at, summary.dataset, summary.global_step) == (None, None, 40)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("best_metrics"), "missing required key 'best_metrics'"),
    (lambda d: d.update(global_stp=3), "unknown key 'global_stp'"),
    (lambda d: d.update(global_step="40"), "global_step must be int"),
    (lambda d: d["compression"].pop("method"), "missing required key 'compression.method'"),
])
def test_a_malformed_summary_is_a_clear_error(change, message):
    data = json.loads(SUMMARY.to_json())
    change(data)
    with pytest.raises(RunSummaryError, match=message):
        RunSummary.from_json(json.dumps(data), source="runs/r1/summary.json")


def test_summary_that_is_not_json_is_a_clear_error():
    with pytest.raises(RunSummaryError, match="not valid JSON"):
        RunSummary.from_json('{"status": "completed",')


def test_summary_absent_means_unfinished_and_written_means_finished(tmp_path):
    run = RunDir(tmp_path / "r1")
    assert run.read_summary() is None and read_summary(run.path) is None
    run.write_summary(SUMMARY)
    assert run.read_summary().global_step == 40
    assert read_summary(run.path)["compression"]["method"] == "topk_ef"  # the dict view launch returns
    assert [p.name for p in run.path.iterdir()] == ["summary.json"]  # no temporary file left


def test_metrics_readers_skip_a_torn_last_line_and_refuse_corruption_elsewhere(tmp_path):
    run = RunDir(tmp_path / "r1")
    for step in (1, 2, 3):
        run.append_step({"step": step, "loss": 1.0 / step})
    with run.steps.open("a") as fh:
        fh.write('{"step": 4, "lo')  # a writer killed mid-append
    assert [r["step"] for r in run.read_steps()] == [1, 2, 3]
    run.steps.write_text('{"step": 1}\n{broken\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        run.read_steps()


def test_truncating_for_a_resume_drops_later_records_and_a_torn_line(tmp_path):
    run = RunDir(tmp_path / "r1")
    for step in (1, 2, 3, 4):
        run.append_step({"step": step})
    run.append_epoch({"step": 2, "epoch": 0})
    run.append_epoch({"step": 4, "epoch": 1})
    with run.steps.open("a") as fh:
        fh.write('{"step": 5, "lo')
    run.truncate_metrics_after(2)
    assert [r["step"] for r in run.read_steps()] == [1, 2]
    assert run.read_epochs() == [{"step": 2, "epoch": 0}]
    run.append_step({"step": 3})
    assert [json.loads(line)["step"] for line in run.steps.read_text().splitlines()] == [1, 2, 3]


def test_inputs_keep_the_manifest_file_byte_for_byte(tmp_path):
    manifest_file = tmp_path / "manifests" / "v-abc.json"
    manifest_file.parent.mkdir()
    manifest_file.write_bytes(b'{"version": "v-abc"}\n  ')
    run = RunDir(tmp_path / "r1")
    run.write_inputs({"loop": {"epochs": 2}}, manifest_file, tmp_path)
    assert run.dataset.read_bytes() == manifest_file.read_bytes()
    assert run.read_config() == {"loop": {"epochs": 2}}
    assert run.read_dataset_root() == tmp_path.resolve()


def _checkpoint(run: RunDir, step: int, is_best: bool) -> None:
    model = FraudModel(FraudModelConfig(("a",), {"c": 3}, embedding_dim=2, hidden_dim=4, num_blocks=1))
    checkpointer = Checkpointer(run.checkpoints, rank=0, world_size=1, keep_last=5, barrier=lambda: None)
    checkpointer.save(step, 0, {"model": model.state_dict()}, {"rng_cpu": torch.get_rng_state()},
                      model.config.to_json(), is_best)


def test_find_checkpoint_prefers_best_then_the_latest_step(tmp_path):
    run = RunDir(tmp_path / "r1")
    assert run.find_checkpoint() is None
    _checkpoint(run, 2, is_best=False)
    _checkpoint(run, 10, is_best=False)
    assert run.find_checkpoint() == run.checkpoints / "step-00000010"
    _checkpoint(run, 4, is_best=True)
    assert run.find_checkpoint() == run.best_checkpoint
    assert RunDir.of_checkpoint(run.best_checkpoint) == run
    assert RunDir.of_checkpoint(tmp_path / "elsewhere" / "best") is None
