"""What a complete checkpoint is: one definition, so the Checkpointer (resume, pruning) and the
run directory's readers (rollback, export) see the same checkpoints."""

from __future__ import annotations

import torch

from models.fraud_mlp import FraudModel, FraudModelConfig
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.checkpoint_layout import TRAINER_FILE, is_checkpoint, step_checkpoints, step_dir_name
from pipeline.training.run_dir import RunDir

CONFIG = FraudModelConfig(("a",), {"c": 3}, embedding_dim=2, hidden_dim=4, num_blocks=1)


def _save(checkpointer: Checkpointer, step: int, is_best: bool = False) -> None:
    model = FraudModel(CONFIG)
    checkpointer.save(step, 0, {"model": model.state_dict()}, {"rng_cpu": torch.get_rng_state()},
                      CONFIG.to_json(), is_best)


def test_names_of_step_directories():
    assert step_dir_name(200) == "step-00000200"


def test_only_complete_step_directories_count_for_the_checkpointer_and_the_run_directory(tmp_path):
    run = RunDir(tmp_path / "r1")
    checkpointer = Checkpointer(run.checkpoints, rank=0, world_size=1, keep_last=5, barrier=lambda: None)
    _save(checkpointer, 3)
    _save(checkpointer, 12)
    (run.checkpoints / step_dir_name(20)).mkdir()  # a directory under a checkpoint name, no checkpoint in it
    (run.checkpoints / "step-7").mkdir()  # not a step name
    (run.checkpoints / "step-7" / TRAINER_FILE).write_bytes(b"")
    expected = [run.checkpoints / "step-00000003", run.checkpoints / "step-00000012"]
    assert step_checkpoints(run.checkpoints) == expected
    assert checkpointer.step_dirs() == expected and checkpointer.latest() == expected[-1]
    assert run.find_checkpoint() == expected[-1]
    assert is_checkpoint(expected[0]) and not is_checkpoint(run.checkpoints / step_dir_name(20))


def test_best_is_a_checkpoint_but_not_a_step(tmp_path):
    run = RunDir(tmp_path / "r1")
    checkpointer = Checkpointer(run.checkpoints, rank=0, world_size=1, keep_last=5, barrier=lambda: None)
    _save(checkpointer, 4, is_best=True)
    assert is_checkpoint(run.best_checkpoint) and run.find_checkpoint() == run.best_checkpoint
    assert step_checkpoints(run.checkpoints) == [run.checkpoints / "step-00000004"]
