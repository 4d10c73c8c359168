"""A loaded model bound to the service's features: fraud probability plus what moved it.

:func:`check_feature_schema` refuses a model that needs a feature the service does not compute, or
whose categorical cardinalities differ from the feature definitions (its codes would be clamped
into the wrong embedding rows and it would score garbage, silently). :meth:`Scorer.warm_up`
refuses one whose scores are not probabilities. Both run before a model takes traffic.

Attribution is occlusion against the training mean, in the same forward as the score: row 0 is
the payment, row ``1 + i`` is the payment with feature ``i`` set to "missing" (NaN numerics become
the training mean inside the model, code 0 is "unknown"). A feature's contribution is
``score - score with it missing``: positive values pushed the score up. :meth:`Scorer.score_many`
scores several payments, with their occlusion rows, in one forward: the cost of a one-row call is
mostly torch's per-operator overhead, paid once for the batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models.fraud_mlp import FraudModel, FraudModelConfig
from pipeline.features import definitions as fd
from pipeline.serving.errors import ModelRejected

FeatureRow = Mapping[str, float | int]
FORWARD_CHUNK = 64  # payments per forward: 64 * 31 rows, activations of a few MB (a 500-payment batch: ~8 forwards)


def check_feature_schema(config: FraudModelConfig) -> None:
    """Raise ModelRejected unless every model input is a feature the service computes, alike."""
    unknown_numeric = [n for n in config.numeric_features if n not in fd.NUMERIC_FEATURES]
    unknown_categorical = [n for n in config.categorical_features if n not in fd.CATEGORICAL_FEATURES]
    resized = {n: (c, fd.CATEGORICAL_FEATURES[n]) for n, c in config.categorical_features.items()
               if n in fd.CATEGORICAL_FEATURES and c != fd.CATEGORICAL_FEATURES[n]}
    if unknown_numeric or unknown_categorical or resized:
        raise ModelRejected(
            f"the model's feature schema does not match the service's (feature version {fd.FEATURE_VERSION}): "
            f"unknown numeric {unknown_numeric}, unknown categorical {unknown_categorical}, categorical "
            f"cardinalities (model, service) {resized}. It was trained on another feature version: serve it "
            "with the matching service release, or promote a model trained on current features")


@dataclass(frozen=True)
class Attribution:
    feature: str
    value: float
    contribution: float  # score minus the score with this feature at its training mean / unknown

    def to_dict(self) -> dict[str, float | str]:
        return {"feature": self.feature, "value": self.value, "contribution": round(self.contribution, 6)}


@dataclass(frozen=True)
class Scored:
    score: float
    top_features: tuple[Attribution, ...]


class Scorer:
    """One registered version, ready to score feature rows (immutable once built; shareable)."""

    def __init__(self, model: FraudModel, version: int, explain_top_k: int) -> None:
        check_feature_schema(model.config)
        self.model = model.eval()
        self.version = version
        self.loaded_at = time.time()
        self.numeric = tuple(model.config.numeric_features)
        self.categorical = tuple(model.config.categorical_features)
        self.explain_top_k = explain_top_k
        n_num, n_cat = len(self.numeric), len(self.categorical)
        # Occlusion block of one payment: row 1 + i blanks feature i (numerics first, then categoricals).
        self._width = 1 + n_num + n_cat
        self._blank_numeric = np.zeros((self._width, n_num), dtype=bool)
        self._blank_numeric[np.arange(n_num) + 1, np.arange(n_num)] = True
        self._blank_categorical = np.zeros((self._width, n_cat), dtype=bool)
        self._blank_categorical[np.arange(n_cat) + 1 + n_num, np.arange(n_cat)] = True

    def _arrays(self, rows: Sequence[FeatureRow]) -> tuple[np.ndarray, np.ndarray]:
        """The model's inputs of ``rows``: numeric ``[n, F]`` float32, categorical ``[n, C]`` int64."""
        numeric = np.array([[row[n] for n in self.numeric] for row in rows], dtype=np.float32)
        categorical = np.array([[row[c] for c in self.categorical] for row in rows], dtype=np.int64)
        return numeric.reshape(len(rows), len(self.numeric)), categorical.reshape(len(rows), len(self.categorical))

    def score(self, row: FeatureRow) -> Scored:
        """Fraud probability of one feature row, with its ``explain_top_k`` strongest features."""
        return self.score_many((row,))[0]

    def score_many(self, rows: Sequence[FeatureRow]) -> list[Scored]:
        """:meth:`score` of each row, in one forward per ``FORWARD_CHUNK`` rows (each row with its
        occlusion rows: ``1 + features`` model rows per payment)."""
        if self.explain_top_k == 0:
            return [Scored(score, ()) for score in self.score_rows(rows)]
        out = []
        for start in range(0, len(rows), FORWARD_CHUNK):
            out += self._score_chunk(rows[start: start + FORWARD_CHUNK])
        return out

    def _score_chunk(self, rows: Sequence[FeatureRow]) -> list[Scored]:
        n = len(rows)
        numeric, categorical = self._arrays(rows)
        blocks = (n * self._width, -1)  # payment i's occlusion block is rows i * width .. (i + 1) * width - 1
        numeric = np.where(self._blank_numeric, np.float32(math.nan), numeric[:, None, :]).reshape(blocks)
        categorical = np.where(self._blank_categorical, 0, categorical[:, None, :]).reshape(blocks)
        with torch.inference_mode():
            probs = self.model.predict_proba(torch.from_numpy(numeric), torch.from_numpy(categorical)).tolist()
        names = self.numeric + self.categorical
        out = []
        for row, base in zip(rows, range(0, n * self._width, self._width), strict=True):
            score, blanked = probs[base], probs[base + 1: base + self._width]
            ranked = sorted(range(len(names)), key=lambda i: -abs(score - blanked[i]))[: self.explain_top_k]
            out.append(Scored(score, tuple(Attribution(names[i], float(row[names[i]]), score - blanked[i])
                                           for i in ranked)))
        return out

    def score_rows(self, rows: Sequence[FeatureRow]) -> list[float]:
        """Fraud probabilities of many rows in one forward (no attribution: the shadow model's path)."""
        if not rows:
            return []
        numeric, categorical = self._arrays(rows)
        with torch.inference_mode():
            return self.model.predict_proba(torch.from_numpy(numeric), torch.from_numpy(categorical)).tolist()

    def warm_up(self, rows: Sequence[FeatureRow]) -> None:
        """Score ``rows`` one by one and together (as requests will be), and in a batch; ModelRejected
        unless every score is a probability. Also pays the first-call costs before the model takes traffic."""
        scores = ([self.score(row).score for row in rows] + [s.score for s in self.score_many(rows)]
                  + self.score_rows(rows))
        bad = [s for s in scores if not (math.isfinite(s) and 0.0 <= s <= 1.0)]
        if bad:
            raise ModelRejected(f"version {self.version} scores {len(bad)} of {len(scores)} warm-up rows outside "
                                f"[0, 1] (e.g. {bad[0]}): its weights are broken; it will not serve")
