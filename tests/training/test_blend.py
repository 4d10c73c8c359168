"""The blend step of finalisation: a booster fitted on the run's rows, stacked with the network by the
calibration fit, kept only when it ranks validation better, and shipped in best/ and model/ alike."""

from __future__ import annotations

import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from models.fraud_mlp import FraudModel, FraudModelConfig, load_model
from models.gbm import GBM_CONFIG_FILE
from pipeline.decisions.operating_points import DecisionBudget
from pipeline.metrics import average_precision
from pipeline.training.blend import split_inputs
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.config import BlendConfig
from pipeline.training.export import export_model_from_checkpoint
from pipeline.training.finalize import finalize_run
from pipeline.training.run_dir import RunDir
from tests.training.test_finalize import _loss, _outcome

# min_ap_gain decides keeping: -1 keeps any blend, 1 none (no AP gains a whole point).
ALWAYS, NEVER = BlendConfig(gbm=True, min_ap_gain=-1.0, max_rounds=60), BlendConfig(gbm=True, min_ap_gain=1.0,
                                                                                    max_rounds=60)


def _finalize(tmp_path, dataset, manifest, blend: BlendConfig, name: str = "run"):
    torch.manual_seed(0)
    model = FraudModel(FraudModelConfig(manifest.numeric_features, dict(manifest.categorical_features),
                                        embedding_dim=2, hidden_dim=8, num_blocks=1))
    run = RunDir(tmp_path / name)
    checkpointer = Checkpointer(run.checkpoints, rank=0, world_size=1, keep_last=2, barrier=lambda: None)
    checkpointer.save(6, 1, {"model": model.state_dict()}, {}, model.config.to_json(), is_best=True)
    summary = finalize_run(run, checkpointer, dataset, manifest, _loss(manifest), _outcome(time.time()),
                           DecisionBudget(), blend, seed=3)
    return run, checkpointer, summary


def _validation_probabilities(model: FraudModel, dataset, manifest) -> np.ndarray:
    x, _ = split_inputs(dataset, manifest, "validation")
    f = len(manifest.numeric_features)
    numeric, categorical = torch.from_numpy(x[:, :f]).float(), torch.from_numpy(x[:, f:]).long()
    return model.eval().predict_proba(numeric, categorical).numpy().astype(np.float64)


def test_a_kept_blend_is_the_model_the_run_ships_and_scores(tmp_path, tiny_dataset, tiny_manifest):
    run, checkpointer, summary = _finalize(tmp_path, tiny_dataset, tiny_manifest, ALWAYS)
    assert summary.blend is not None and summary.blend.kept and summary.blend.trees >= 1
    shipped = load_model(run.model)
    assert shipped.gbm is not None and shipped.gbm.weight == pytest.approx(summary.blend.gbm_weight)
    assert (checkpointer.best / GBM_CONFIG_FILE).is_file()
    # validation_scores.parquet (what the operating points were chosen on) holds the blend's probabilities
    written = pq.read_table(run.validation_scores).to_pandas()["score"].to_numpy()
    np.testing.assert_allclose(written, _validation_probabilities(shipped, tiny_dataset, tiny_manifest), atol=1e-5)
    labels = pq.read_table(run.validation_scores).to_pandas()["label"].to_numpy()
    assert average_precision(labels, written) == pytest.approx(summary.blend.validation_ap_blend, abs=1e-4)
    # the checkpoint's export (rollback --from-checkpoint) is the same blend
    exported = load_model(export_model_from_checkpoint(checkpointer.best, tmp_path / "exported"))
    np.testing.assert_allclose(_validation_probabilities(exported, tiny_dataset, tiny_manifest), written, atol=1e-5)


def test_a_blend_that_does_not_rank_validation_better_is_dropped(tmp_path, tiny_dataset, tiny_manifest):
    run, checkpointer, summary = _finalize(tmp_path, tiny_dataset, tiny_manifest, NEVER)
    assert summary.blend is not None and not summary.blend.kept and summary.blend.gbm_weight == 0.0
    assert summary.blend.validation_ap_network == pytest.approx(
        average_precision(pq.read_table(run.validation_scores).to_pandas()["label"].to_numpy(),
                          pq.read_table(run.validation_scores).to_pandas()["score"].to_numpy()), abs=1e-4)
    assert load_model(run.model).gbm is None and not (checkpointer.best / GBM_CONFIG_FILE).exists()


def test_finalizing_again_without_the_blend_removes_the_booster(tmp_path, tiny_dataset, tiny_manifest):
    run, checkpointer, _ = _finalize(tmp_path, tiny_dataset, tiny_manifest, ALWAYS)
    run.summary.unlink()
    again = finalize_run(run, checkpointer, tiny_dataset, tiny_manifest, _loss(tiny_manifest), _outcome(time.time()),
                         DecisionBudget(), BlendConfig(gbm=False))
    assert again.blend is None and load_model(run.model).gbm is None
    assert not (checkpointer.best / GBM_CONFIG_FILE).exists()
