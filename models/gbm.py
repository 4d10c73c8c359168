"""The gradient-boosted half of a blended model: a LightGBM booster whose raw score, times a weight,
is added to the network's calibrated logit.

Why a blend: on every benchmark portfolio the network and LightGBM trained on the same rows make
different mistakes. Averaging their log-odds ranked better than either alone on the protocol holdout
(one seed, ``fraudctl bench baseline``'s data: AP 0.469 ours / 0.409 LightGBM / 0.507 blended on the
default portfolio, 0.519 / 0.519 / 0.528 on the high-fraud one). The blend is one model version:
the booster travels in the model directory beside the weights, every consumer scores through
:meth:`models.fraud_mlp.FraudModel.predict_proba`, and the gate judges it like any model.

The booster reads the model's inputs as they are, in the model's order (numeric features, then the
categorical codes as LightGBM categoricals); a NaN numeric (the scorer's "feature missing" in
occlusion) takes LightGBM's missing-value branch, as the network maps it to the training mean.

Saved as LightGBM's text format (``gbm.txt``: trees as text, no pickle) and ``gbm.json`` (weight,
feature order, categorical columns, best iteration), read back by :func:`load_gbm_term`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GBM_MODEL_FILE = "gbm.txt"
GBM_CONFIG_FILE = "gbm.json"


@dataclass(frozen=True)
class GbmTerm:
    """``weight * raw_score`` of a LightGBM booster over the model's inputs (numeric, then categorical)."""

    booster: object  # lightgbm.Booster (imported lazily: a model without a booster never needs it)
    weight: float
    features: tuple[str, ...]  # the booster's columns: the model's numeric then categorical features
    categorical: tuple[int, ...]  # their positions among ``features``
    best_iteration: int

    def logit(self, numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        """The term for rows ``numeric [n, F]``, ``categorical [n, C]``: float64 ``[n]``."""
        x = np.concatenate([np.asarray(numeric, dtype=np.float64), np.asarray(categorical, dtype=np.float64)],
                           axis=1)
        if x.shape[0] == 0:
            return np.zeros(0)
        raw = self.booster.predict(x, raw_score=True, num_iteration=self.best_iteration, num_threads=1)
        return self.weight * np.asarray(raw, dtype=np.float64)

    def with_weight(self, weight: float) -> GbmTerm:
        return GbmTerm(self.booster, float(weight), self.features, self.categorical, self.best_iteration)


def save_gbm_term(term: GbmTerm, directory: Path) -> None:
    """Write ``gbm.txt`` and ``gbm.json`` into ``directory``, a model directory being built: not
    atomic by itself, so a directory anyone may read is built beside its name and published whole
    (``pipeline.atomic.staged_dir``), which pairs the trees with the weight saved with them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    term.booster.save_model(str(directory / GBM_MODEL_FILE), num_iteration=term.best_iteration)
    (directory / GBM_CONFIG_FILE).write_text(json.dumps(
        {"weight": term.weight, "features": list(term.features), "categorical": list(term.categorical),
         "best_iteration": term.best_iteration}, indent=1))


def remove_gbm_term(directory: Path) -> None:
    """Take a booster out of ``directory`` (the JSON first: without it the directory holds none)."""
    for name in (GBM_CONFIG_FILE, GBM_MODEL_FILE):
        (Path(directory) / name).unlink(missing_ok=True)


def load_gbm_term(directory: Path) -> GbmTerm | None:
    """The directory's booster term, or None when it holds none (a network-only model)."""
    directory = Path(directory)
    if not (directory / GBM_CONFIG_FILE).is_file():
        return None
    import lightgbm as lgb

    meta = json.loads((directory / GBM_CONFIG_FILE).read_text())
    booster = lgb.Booster(model_file=str(directory / GBM_MODEL_FILE))
    # saved with num_iteration=best: the file holds exactly the trees that score
    return GbmTerm(booster, float(meta["weight"]), tuple(meta["features"]), tuple(meta["categorical"]),
                   booster.current_iteration())
