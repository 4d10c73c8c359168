"""A loaded model bound to the service's features: fraud probability plus what moved it.

:func:`check_feature_schema` refuses a model that needs a feature the service does not compute, or
whose categorical cardinalities differ from the feature definitions (its codes would be clamped
into the wrong embedding rows and it would score garbage, silently). :meth:`Scorer.warm_up`
refuses one whose scores are not probabilities. Both run before a model takes traffic.

Attribution is occlusion against the training mean: row ``i`` of a payment's occlusion block is the
payment with feature ``i`` set to "missing" (NaN numerics become the training mean inside the model,
code 0 is "unknown"). A feature's contribution is ``score - score with it missing``: positive values
pushed the score up. :meth:`Scorer.score_many` scores several payments in one forward (the cost of a
one-row call is mostly torch's per-operator overhead, paid once for the batch), then the occlusion
blocks of those scoring at least ``explain_min_score`` in one more.

Why a floor: an occlusion block is one model row per feature (~30), so explaining every payment
costs ~30x the score itself, almost all of it on payments the score lets through, whose reasons
nobody reads. With the floor at the review threshold, every payment the score sends to review or
declines is explained, at a cost proportional to how many there are.

The network runs as a frozen TorchScript graph traced from the loaded module (:func:`traced_logit`),
not as the eager module: at the service's batch sizes a forward is mostly per-operator overhead, and
eager pays it in Python, holding the GIL the event loop needs, while the graph's interpreter runs in
C++ without it (measured: 645 -> 314 us for 8 payments, both on one thread). The graph is built from the
same weights in memory (nothing is loaded from a serialised graph, so still no unpickling), and
:meth:`Scorer.warm_up` checks that it scores the warm-up rows as the eager module does; if tracing
fails or disagrees, the version serves with the eager module and ``forward`` in /health says so.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models.fraud_mlp import FraudModel, FraudModelConfig
from pipeline.features import definitions as fd
from pipeline.serving.errors import ModelRejected

FeatureRow = Mapping[str, float | int]
FORWARD_CHUNK = 64  # payments explained per forward: 64 * 30 rows, activations of a few MB
MATRIX_CHUNK = 4096  # rows per forward when a loaded version scores the recent traffic
TRACE_TOLERANCE = 1e-6  # largest |graph - eager| score accepted on the warm-up rows

log = logging.getLogger(__name__)
Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class _CalibratedLogit(torch.nn.Module):
    """``calibrated_logit`` as a module's forward: what gets traced."""

    def __init__(self, model: FraudModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        return self.model.calibrated_logit(numeric, categorical)


def traced_logit(model: FraudModel) -> torch.jit.ScriptModule:
    """``model.calibrated_logit`` (``model`` in eval mode: the network; a blend's booster is added
    outside the graph, which would record its output as a constant) as a frozen, inference-optimised
    TorchScript graph, for any batch size.

    Tracing records the ops of one example forward; the model's only branches are on its config
    (bins, members, embedding tables, the sequence encoder), fixed for the life of the graph, so the record is the model.
    TorchScript is deprecated in favour of torch.compile / torch.export; torch.compile scored at about
    the same CPU per call here but compiled for 42 s per version and needs a C++ toolchain on the
    scoring host. The deprecation warnings are silenced here, and a torch without TorchScript makes
    the scorer fall back to eager (see the module doc).
    """
    numeric = torch.zeros(2, len(model.config.numeric_features))
    numeric[0] = math.nan  # the missing-history path (nan_to_num) is traced like any op
    categorical = torch.zeros(2, len(model.config.categorical_features), dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\..* is deprecated")
        # The GRU's own shape checks warn that a trace records them as constants: they check the
        # example's batch size, which the graph does not depend on (tested at other sizes).
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        with torch.inference_mode():
            # optimize_for_inference: freezes (weights become constants), then folds and fuses what
            # it can (8 payments: another ~20% off the frozen graph's time).
            return torch.jit.optimize_for_inference(torch.jit.trace(_CalibratedLogit(model).eval(),
                                                                    (numeric, categorical), check_trace=False))


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

    def __init__(self, model: FraudModel, version: int, explain_top_k: int, explain_min_score: float = 0.0) -> None:
        check_feature_schema(model.config)
        self.model = model.eval()
        self._logit_fn: Forward = model.calibrated_logit
        self.forward = "eager"  # or "torchscript" once warm_up has checked the traced graph
        self.version = version
        self.loaded_at = time.time()
        self.numeric = tuple(model.config.numeric_features)
        self.categorical = tuple(model.config.categorical_features)
        self.explain_top_k = explain_top_k
        self.explain_min_score = explain_min_score  # payments scoring below it get no attribution
        n_num, n_cat = len(self.numeric), len(self.categorical)
        # Occlusion block of one payment: row i blanks feature i (numerics first, then categoricals).
        self._width = n_num + n_cat
        self._blank_numeric = np.eye(self._width, n_num, dtype=bool)
        self._blank_categorical = np.eye(self._width, n_cat, k=-n_num, dtype=bool)

    def _arrays(self, rows: Sequence[FeatureRow]) -> tuple[np.ndarray, np.ndarray]:
        """The model's inputs of ``rows``: numeric ``[n, F]`` float32, categorical ``[n, C]`` int64."""
        numeric = np.array([[row[n] for n in self.numeric] for row in rows], dtype=np.float32)
        categorical = np.array([[row[c] for c in self.categorical] for row in rows], dtype=np.int64)
        return numeric.reshape(len(rows), len(self.numeric)), categorical.reshape(len(rows), len(self.categorical))

    def score(self, row: FeatureRow) -> Scored:
        """Fraud probability of one feature row, with its ``explain_top_k`` strongest features when
        it scores at least ``explain_min_score``."""
        return self.score_many((row,))[0]

    def score_many(self, rows: Sequence[FeatureRow]) -> list[Scored]:
        """:meth:`score` of each row: one forward for the scores, then one per ``FORWARD_CHUNK``
        payments to explain (each with ``features`` occlusion rows)."""
        if not rows:
            return []
        numeric, categorical = self._arrays(rows)
        scores = self._forward(numeric, categorical)
        explained: dict[int, tuple[Attribution, ...]] = {}
        if self.explain_top_k > 0:
            chosen = [i for i, score in enumerate(scores) if score >= self.explain_min_score]
            for start in range(0, len(chosen), FORWARD_CHUNK):
                chunk = chosen[start: start + FORWARD_CHUNK]
                explained |= zip(chunk, self._explain(rows, chunk, scores, numeric[chunk], categorical[chunk]), strict=True)
        return [Scored(score, explained.get(i, ())) for i, score in enumerate(scores)]

    def _explain(self, rows: Sequence[FeatureRow], chosen: list[int], scores: list[float], numeric: np.ndarray,
                 categorical: np.ndarray) -> list[tuple[Attribution, ...]]:
        """The ``explain_top_k`` strongest features of rows ``chosen`` (their inputs: ``numeric``,
        ``categorical``), from one forward of their occlusion blocks."""
        blocks = (len(chosen) * self._width, -1)  # payment j's block: rows j * width .. (j + 1) * width - 1
        blanked = self._forward(np.where(self._blank_numeric, np.float32(math.nan), numeric[:, None, :]).reshape(blocks),
                                np.where(self._blank_categorical, 0, categorical[:, None, :]).reshape(blocks))
        names = self.numeric + self.categorical
        out = []
        for j, i in enumerate(chosen):
            score, row = scores[i], rows[i]
            moved = [score - b for b in blanked[j * self._width: (j + 1) * self._width]]
            ranked = sorted(range(len(names)), key=lambda f: -abs(moved[f]))[: self.explain_top_k]
            out.append(tuple(Attribution(names[f], float(row[names[f]]), moved[f]) for f in ranked))
        return out

    def _forward(self, numeric: np.ndarray, categorical: np.ndarray) -> list[float]:
        """Probabilities: the network's calibrated logit (graph or eager) plus a blend's booster term,
        as :meth:`FraudModel.predict_proba` computes them."""
        with torch.inference_mode():
            inputs = torch.from_numpy(numeric), torch.from_numpy(categorical)
            logit = self._logit_fn(*inputs)
            boosted = self.model.gbm_logit(*inputs)
            return torch.sigmoid(logit if boosted is None else logit + boosted).tolist()

    def score_rows(self, rows: Sequence[FeatureRow]) -> list[float]:
        """Fraud probabilities of many rows in one forward (no attribution: the shadow model's path)."""
        return self._forward(*self._arrays(rows)) if rows else []

    def score_matrix(self, matrix: np.ndarray, columns: Sequence[str]) -> list[float]:
        """Fraud probabilities of feature rows held as a matrix whose columns are named ``columns``
        (:class:`.recent_traffic.RecentTraffic`'s), in forwards of at most ``MATRIX_CHUNK`` rows."""
        index = {name: i for i, name in enumerate(columns)}
        numeric = matrix[:, [index[n] for n in self.numeric]].astype(np.float32)
        categorical = matrix[:, [index[c] for c in self.categorical]].astype(np.int64)
        scores: list[float] = []
        for start in range(0, matrix.shape[0], MATRIX_CHUNK):
            scores += self._forward(numeric[start:start + MATRIX_CHUNK], categorical[start:start + MATRIX_CHUNK])
        return scores

    def _use_traced_graph(self, rows: Sequence[FeatureRow]) -> None:
        """Serve with :func:`traced_logit` of the model if it agrees with the eager module on
        ``rows`` (and on their occlusion blocks' missing values); else stay eager and log why."""
        try:
            graph = traced_logit(self.model)
            numeric, categorical = self._arrays(rows)
            numeric = np.concatenate([numeric, np.full_like(numeric[:1], math.nan)])  # + an all-missing row
            categorical = np.concatenate([categorical, np.zeros_like(categorical[:1])])
            with torch.inference_mode():
                inputs = torch.from_numpy(numeric), torch.from_numpy(categorical)
                gap = (torch.sigmoid(graph(*inputs)) - torch.sigmoid(self.model.calibrated_logit(*inputs))).abs().max().item()
        except Exception as exc:  # any tracing failure: the eager module still scores correctly
            log.warning("version %s: TorchScript tracing failed (%s); scoring with the eager module", self.version, exc)
            return
        if not gap <= TRACE_TOLERANCE:
            log.warning("version %s: the traced graph's scores differ from the eager module's by %s on the warm-up "
                        "rows; scoring with the eager module", self.version, gap)
            return
        self._logit_fn, self.forward = graph, "torchscript"

    def warm_up(self, rows: Sequence[FeatureRow]) -> None:
        """Score ``rows`` one by one and together (as requests will be), and explain them whatever
        their scores; ModelRejected unless every score (occluded ones included) is a probability. Also
        pays the first-call costs before the model takes traffic. Before that, switches the forward to
        the traced graph if it scores the rows as the eager module does."""
        self._use_traced_graph(rows)
        scores = [self.score(row).score for row in rows] + self.score_rows(rows)
        if self.explain_top_k > 0 and rows:
            explained = self._explain(rows, list(range(len(rows))), scores, *self._arrays(rows))
            scores += [scores[i] - a.contribution for i, attributions in enumerate(explained) for a in attributions]
        bad = [s for s in scores if not (math.isfinite(s) and 0.0 <= s <= 1.0)]
        if bad:
            raise ModelRejected(f"version {self.version} scores {len(bad)} of {len(scores)} warm-up rows outside "
                                f"[0, 1] (e.g. {bad[0]}): its weights are broken; it will not serve")
