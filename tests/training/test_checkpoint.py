"""Checkpointer storage semantics in one process (the collective use is covered end to end)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from models.fraud_mlp import FraudModel, FraudModelConfig, load_model
from models.gbm import GBM_CONFIG_FILE, GbmTerm
from pipeline.atomic import old_dir_path
from pipeline.training.checkpoint import (
    BEST,
    CALIBRATION_FILE,
    TRAINER_FILE,
    Checkpointer,
    CheckpointError,
    load_tensor_file,
    rank_file,
)
from pipeline.training.export import export_model_from_checkpoint, load_checkpoint_model

CONFIG = FraudModelConfig(("a", "b"), {"c": 4}, embedding_dim=2, hidden_dim=8, num_blocks=1)


def _checkpointer(path: Path, keep: int = 2) -> Checkpointer:
    return Checkpointer(path, rank=0, world_size=1, keep_last=keep, barrier=lambda: None)


def _save(ck: Checkpointer, step: int, model: FraudModel, is_best: bool = False) -> Path:
    trainer_state = {"model": model.state_dict(), "trainer": {"global_step": step, "best_ap": 0.5}}
    rank_state = {"rng_cpu": torch.get_rng_state(), "residuals": {"input.weight": torch.full((3,), float(step))}}
    return ck.save(step, 0, trainer_state, rank_state, CONFIG.to_json(), is_best)


def test_save_load_round_trip_is_exact(tmp_path):
    torch.manual_seed(0)
    model = FraudModel(CONFIG)
    ck = _checkpointer(tmp_path / "ck")
    path = _save(ck, 7, model)
    assert path.name == "step-00000007" and ck.latest() == path
    trainer_state, rank_state = ck.load(path)
    for key, value in model.state_dict().items():
        assert torch.equal(trainer_state["model"][key], value)
    assert trainer_state["trainer"] == {"global_step": 7, "best_ap": 0.5}
    assert torch.equal(rank_state["residuals"]["input.weight"], torch.full((3,), 7.0))
    assert json.loads((path / "meta.json").read_text())["step"] == 7


def test_keeps_the_last_k_and_best_separately(tmp_path):
    model = FraudModel(CONFIG)
    ck = _checkpointer(tmp_path / "ck", keep=2)
    _save(ck, 1, model, is_best=True)
    for step in (2, 3, 4):
        _save(ck, step, model)
    assert [p.name for p in ck.step_dirs()] == ["step-00000003", "step-00000004"]
    assert ck.best_step() == 1  # best survives pruning of its step directory
    _save(ck, 5, model, is_best=True)
    assert ck.best_step() == 5


def test_an_interrupted_save_is_invisible_and_cleaned_up(tmp_path):
    model = FraudModel(CONFIG)
    ck = _checkpointer(tmp_path / "ck")
    _save(ck, 2, model)
    partial = tmp_path / "ck" / ".tmp-step-00000004"
    partial.mkdir()
    (partial / rank_file(0)).write_bytes(b"truncated")
    assert ck.latest().name == "step-00000002"
    _checkpointer(tmp_path / "ck")  # the next start removes leftovers
    assert not partial.exists()


def test_a_kill_in_the_middle_of_swapping_best_restores_the_previous_best(tmp_path):
    model = FraudModel(CONFIG)
    ck = _checkpointer(tmp_path / "ck")
    _save(ck, 3, model, is_best=True)
    # the state right after the first rename of publish_dir's fallback (no exchange on this filesystem)
    os.replace(tmp_path / "ck" / BEST, old_dir_path(tmp_path / "ck" / BEST))
    ck = _checkpointer(tmp_path / "ck")
    assert ck.best_step() == 3


def test_ensure_best_repairs_best_after_a_kill_between_save_and_mark(tmp_path):
    model = FraudModel(CONFIG)
    ck = _checkpointer(tmp_path / "ck")
    _save(ck, 3, model, is_best=True)
    _save(ck, 6, model, is_best=False)  # as if killed before marking it best
    ck.ensure_best(6)
    assert ck.best_step() == 6


class Arbitrary:
    """Any class: unpickling it could run code, so weights_only loading must refuse it."""


def test_loading_refuses_pickled_objects(tmp_path):
    path = tmp_path / "bad.pt"
    torch.save({"x": Arbitrary()}, path)
    with pytest.raises(CheckpointError, match="cannot read"):
        load_tensor_file(path)


def test_export_rebuilds_the_model_with_calibration(tmp_path):
    torch.manual_seed(3)
    model = FraudModel(CONFIG)
    model.set_normalization(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]))
    ck = _checkpointer(tmp_path / "ck")
    _save(ck, 1, model, is_best=True)
    ck.save_calibrated(temperature=2.0, logit_shift=-0.5, gbm=None)
    out = export_model_from_checkpoint(tmp_path / "ck" / BEST, tmp_path / "exported")
    exported = load_model(out)
    x, c = torch.randn(5, 2), torch.randint(0, 4, (5, 1))
    torch.testing.assert_close(exported.predict_proba(x, c), torch.sigmoid((model.eval()(x, c) - 0.5) / 2.0))
    assert torch.equal(exported.num_std, torch.tensor([3.0, 4.0]))
    uncalibrated = load_checkpoint_model(tmp_path / "ck" / BEST, apply_stored_calibration=False)
    torch.testing.assert_close(uncalibrated(x, c), model(x, c))


def test_finalisation_republishes_best_whole_and_never_writes_through_its_links(tmp_path):
    """best/ is hard links to its step's files: each calibration is a new file in a new best/, so the
    step directory and a reader of the previous best/ keep what they had."""
    model = FraudModel(CONFIG)
    ck = _checkpointer(tmp_path / "ck")
    step = _save(ck, 1, model, is_best=True)
    ck.save_calibrated(temperature=2.0, logit_shift=-0.5, gbm=None)
    with (ck.best / CALIBRATION_FILE).open("rb") as first:  # a reader of the first calibration
        ck.save_calibrated(temperature=3.0, logit_shift=0.25, gbm=None)
        assert float(torch.load(first, weights_only=True)["temperature"]) == 2.0
    assert float(load_tensor_file(ck.best / CALIBRATION_FILE)["temperature"]) == 3.0
    assert not (step / CALIBRATION_FILE).exists()
    assert (ck.best / TRAINER_FILE).stat().st_ino == (step / TRAINER_FILE).stat().st_ino  # still linked
    assert not (ck.best / GBM_CONFIG_FILE).exists()
    assert sorted(p.name for p in ck.directory.iterdir() if p.name.startswith(".")) == []


class _FullDisk:
    """A booster whose save fails, as on a full disk."""

    def save_model(self, *args, **kwargs):
        raise OSError("No space left on device")


def test_a_failed_finalisation_leaves_best_with_its_previous_calibration_and_booster(tmp_path):
    model = FraudModel(CONFIG)
    ck = _checkpointer(tmp_path / "ck")
    _save(ck, 1, model, is_best=True)
    ck.save_calibrated(temperature=2.0, logit_shift=-0.5, gbm=None)
    with pytest.raises(OSError, match="No space"):
        ck.save_calibrated(temperature=3.0, logit_shift=0.25, gbm=GbmTerm(_FullDisk(), 0.5, ("a", "b", "c"), (2,), 1))
    assert float(load_tensor_file(ck.best / CALIBRATION_FILE)["temperature"]) == 2.0  # not 3.0 without its booster
    assert not (ck.best / GBM_CONFIG_FILE).exists()
    assert sorted(p.name for p in ck.directory.iterdir()) == [BEST, "step-00000001"]


def test_export_of_a_non_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="not a training checkpoint"):
        export_model_from_checkpoint(tmp_path, tmp_path / "out")
