"""The real Trainer (one process) learns a fraud rule hidden at one amount threshold, to the cent.

Regression test of the numeric encoding: the tree-fitted bin edges must put an edge at the
threshold, the edges must reach the exported model, and training must rank the frauds first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.fraud_mlp import frame_to_tensors, load_model
from pipeline.datasets.manifest import load_manifest
from pipeline.datasets.reader import read_split
from pipeline.training.config import derive_train_config, train_config_from_dict
from pipeline.training.distributed import destroy_distributed, init_distributed
from pipeline.training.trainer import Trainer
from tests.training.threshold_dataset import FRAUD_MCC, THRESHOLD, write_threshold_dataset

# conf/dev's model and optimiser, a short loop: ~23 steps an epoch on 6000 train rows.
OVERRIDES = {
    "data": {"global_batch_size": 256},
    "compression": {"method": "allreduce"},
    "checkpoint": {"every_steps": 100_000},
    "loop": {"epochs": 20, "early_stop_patience": 20, "early_stop_min_delta": 0.0, "log_every": 1_000,
             "checksum_every": 1_000},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("threshold")
    root = work / "data"
    write_threshold_dataset(root)
    config = train_config_from_dict(derive_train_config("dev", OVERRIDES))
    env = init_distributed()
    try:
        Trainer(config, work / "run", root, env).train()
    finally:
        destroy_distributed()
    return root, work / "run" / "model"


def test_a_bin_edge_sits_between_the_threshold_and_the_smallest_fraud(trained):
    root, model_dir = trained
    train = read_split(root, load_manifest(root), "train")
    smallest_fraud = np.float32(train.loc[train["label"] == 1, "amount"].min())
    assert smallest_fraud <= np.float32(THRESHOLD + 0.02)  # the data pins the threshold to a cent or two
    amount_edges = load_model(model_dir).numeric_embedding.encoding.bin_edges[0].numpy()
    assert ((amount_edges >= np.float32(THRESHOLD)) & (amount_edges < smallest_fraud)).any(), amount_edges


def test_frauds_are_ranked_above_every_genuine_payment(trained):
    root, model_dir = trained
    model = load_model(model_dir)
    test = read_split(root, load_manifest(root), "test")
    scores = model.predict_proba(*frame_to_tensors(test, model.config)).numpy()
    fraud = test["label"].to_numpy() == 1
    assert 20 < fraud.sum() < len(test) / 10  # the rule fires, and rarely
    # Every fraud outranks every genuine payment, including the decoys right at the threshold.
    assert scores[fraud].min() > scores[~fraud].max()
    decoys = (test["amount"].to_numpy() == THRESHOLD) & (test["mcc"].to_numpy() == FRAUD_MCC)
    assert decoys.any() and scores[decoys].max() < scores[fraud].min()
