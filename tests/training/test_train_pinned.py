"""train_pinned, the one way the pipeline's stages train: pin the dataset, reuse a finished run,
else launch (torchrun itself runs in test_trainer.py; here the preflight stops it before it starts)."""

from __future__ import annotations

import pytest

from pipeline.training.config import load_train_config
from pipeline.training.launch import Torchrun, TrainingCannotStart, pin_train_config, train_pinned
from pipeline.training.run_dir import CompressionSummary, RunDir, RunSummary

SUMMARY = RunSummary(status="completed", run_name="r", global_step=30, epochs=2, best_epoch=1,
                     best_metrics={"auc_roc": 0.9}, temperature=1.2, bytes_sent_total=1000, bytes_dense_total=100_000,
                     compression=CompressionSummary("topk_ef", 0.01), world_size=2, wall_s=12.0, peak_rss_mb=300.0,
                     stopped_early=False)


@pytest.fixture(autouse=True)
def _no_dataset_root_from_the_environment(monkeypatch):
    monkeypatch.delenv("FRAUD_DATASET_ROOT", raising=False)


def test_the_pinned_dataset_wins_over_overrides_and_the_rest_is_the_environments(tmp_path):
    path = pin_train_config("dev", tmp_path / "ds", "v-1", tmp_path / "train.toml",
                            {"data": {"global_batch_size": 256, "version": "v-other"}, "loop": {"epochs": 2}})
    pinned, checked_in = load_train_config(path=path), load_train_config("dev")
    assert (pinned.data.dataset_root, pinned.data.version) == (str(tmp_path / "ds"), "v-1")
    assert (pinned.data.global_batch_size, pinned.loop.epochs) == (256, 2)
    assert pinned.model == checked_in.model and pinned.optim == checked_in.optim


def test_a_finished_run_is_reused_without_pinning_or_launching(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.write_summary(SUMMARY)
    # No dataset exists: launching anything would fail the preflight.
    result = train_pinned(run, tmp_path / "nothing", "v-1", tmp_path / "train.toml", Torchrun(), env="dev")
    assert result.reused and result.summary == SUMMARY
    assert not (tmp_path / "train.toml").exists()


def test_an_unfinished_run_is_launched_on_the_pinned_root_whatever_the_environment_says(tmp_path, monkeypatch):
    monkeypatch.setenv("FRAUD_DATASET_ROOT", str(tmp_path / "elsewhere"))
    run = RunDir(tmp_path / "run")
    with pytest.raises(TrainingCannotStart, match=f"'v-1' is not published under {tmp_path / 'pinned'}$"):
        train_pinned(run, tmp_path / "pinned", "v-1", tmp_path / "train.toml", Torchrun(nproc_per_node=2), env="dev")
    monkeypatch.delenv("FRAUD_DATASET_ROOT")
    pinned = load_train_config(path=tmp_path / "train.toml")
    assert (pinned.data.dataset_root, pinned.data.version) == (str(tmp_path / "pinned"), "v-1")
    assert not run.path.exists()  # refused before torchrun: no run directory
