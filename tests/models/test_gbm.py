"""A blended model: the booster's weighted raw score added to the network's calibrated logit, saved
beside the weights as text and read back, and never left behind by a network-only save."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest
import torch

from models.fraud_mlp import FraudModel, FraudModelConfig, load_model, save_model
from models.gbm import GBM_CONFIG_FILE, GBM_MODEL_FILE, GbmTerm

REPO = Path(__file__).resolve().parents[2]
CONFIG = FraudModelConfig(("amount", "velocity"), {"mcc": 6, "country": 3}, embedding_dim=3, hidden_dim=16,
                          num_blocks=1, dropout=0.0)


def blended(weight: float = 0.7, seed: int = 0) -> tuple[FraudModel, lgb.Booster]:
    """CONFIG's network with a booster trained on random rows whose label follows amount and mcc."""
    rng = np.random.default_rng(seed)
    x = np.c_[rng.normal(size=(2000, 2)), rng.integers(0, 6, 2000), rng.integers(0, 3, 2000)].astype(np.float64)
    y = ((x[:, 0] + (x[:, 2] == 4) + rng.normal(scale=0.5, size=2000)) > 1.2).astype(int)
    booster = lgb.train({"objective": "binary", "num_leaves": 7, "verbose": -1, "num_threads": 1, "seed": seed},
                        lgb.Dataset(x, y, categorical_feature=[2, 3]), num_boost_round=20)
    torch.manual_seed(seed)
    model = FraudModel(CONFIG).eval()
    model.gbm = GbmTerm(booster, weight, ("amount", "velocity", "mcc", "country"), (2, 3), 20)
    return model, booster


def _inputs(n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 2, generator=gen), torch.randint(0, 3, (n, 2), generator=gen)


def test_the_probability_adds_the_weighted_raw_score_to_the_calibrated_logit():
    model, booster = blended(weight=0.7)
    numeric, categorical = _inputs()
    raw = booster.predict(np.c_[numeric.numpy(), categorical.numpy()].astype(np.float64), raw_score=True)
    expected = torch.sigmoid(model.calibrated_logit(numeric, categorical).detach() + 0.7 * torch.from_numpy(raw).float())
    torch.testing.assert_close(model.predict_proba(numeric, categorical), expected)
    assert not torch.allclose(model.predict_proba(numeric, categorical),
                              torch.sigmoid(model.calibrated_logit(numeric, categorical).detach()))


def test_a_saved_blend_loads_back_scoring_the_same(tmp_path):
    model, _ = blended()
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.gbm is not None and loaded.gbm.weight == pytest.approx(0.7)
    assert loaded.gbm.features == ("amount", "velocity", "mcc", "country") and loaded.gbm.categorical == (2, 3)
    numeric, categorical = _inputs()
    torch.testing.assert_close(loaded.predict_proba(numeric, categorical), model.predict_proba(numeric, categorical))


def test_a_network_saved_over_a_blend_does_not_load_back_as_one(tmp_path):
    model, _ = blended()
    save_model(model, tmp_path)
    model.gbm = None
    save_model(model, tmp_path)
    assert not (tmp_path / GBM_CONFIG_FILE).exists() and not (tmp_path / GBM_MODEL_FILE).exists()
    assert load_model(tmp_path).gbm is None


# The child re-saves two models over one directory, alternately, as fast as it can, the documented
# way (built beside, published whole); it says "ready" once its imports are done.
RESAVE_LOOP = """
import sys
from pathlib import Path
from models.fraud_mlp import load_model, save_model
from pipeline.atomic import staged_dir
target, sources = Path(sys.argv[1]), [load_model(Path(p)) for p in sys.argv[2:]]
print("ready", flush=True)
for i in range(10**9):
    with staged_dir(target) as staging:
        save_model(sources[i % len(sources)], staging)
"""


@pytest.mark.slow
def test_a_resave_killed_at_any_point_leaves_one_whole_model(tmp_path):
    """SIGKILL a process re-saving two blends (different networks, boosters and weights) over one
    directory, at several points: the directory always loads as one of them, never a network paired
    with the other's booster or weight."""
    models = {"a": blended(weight=0.7, seed=0)[0], "b": blended(weight=0.3, seed=1)[0]}
    for name, model in models.items():
        save_model(model, tmp_path / name)
    target = tmp_path / "model"
    save_model(models["a"], target)
    numeric, categorical = _inputs()
    expected = {name: model.predict_proba(numeric, categorical) for name, model in models.items()}
    rng, found = np.random.default_rng(0), []
    for _ in range(6):
        child = subprocess.Popen([sys.executable, "-c", RESAVE_LOOP, str(target), str(tmp_path / "a"),
                                  str(tmp_path / "b")], cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.5))  # hundreds of saves in: the kill lands anywhere in one
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        proba = load_model(target).predict_proba(numeric, categorical)
        found.append([name for name, p in expected.items() if torch.allclose(proba, p, rtol=0, atol=1e-7)])
    assert all(len(match) == 1 for match in found), found
