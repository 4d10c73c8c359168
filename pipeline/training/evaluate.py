"""Validation: score a split with the current model and compute the standard metric set.

Metrics come from :mod:`pipeline.metrics` (the one implementation). Scoring is sharded: each rank
scores its rows, then the results are gathered so every rank holds the same arrays and computes
the same metrics, hence takes the same early-stopping decision without another message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.distributed as dist

from models.fraud_mlp import FraudModel
from pipeline.datasets.manifest import DatasetManifest
from pipeline.metrics import auc_roc, average_precision, classification_report, recall_at_fpr
from pipeline.training.data import iter_eval_chunks
from pipeline.training.sampling import importance_weights


@dataclass
class ScoredSplit:
    logits: np.ndarray  # float32, uncalibrated
    labels: np.ndarray  # int64 0/1
    card_ids: np.ndarray  # str
    days: np.ndarray  # str YYYY-MM-DD (UTC) of event_time
    transaction_ids: np.ndarray  # str
    event_times: np.ndarray  # datetime64[us]

    @staticmethod
    def concat(parts: list[ScoredSplit]) -> ScoredSplit:
        return ScoredSplit(*(np.concatenate([getattr(p, f) for p in parts]) for f in (
            "logits", "labels", "card_ids", "days", "transaction_ids", "event_times")))


@torch.no_grad()
def score_split(model: FraudModel, root: Path, manifest: DatasetManifest, split: str, rank: int, world: int,
                device: torch.device, negative_rate: float = 1.0, seed: int = 0) -> ScoredSplit:
    """Uncalibrated logits of this rank's rows of ``split`` (model put in eval mode, then restored);
    with ``negative_rate`` < 1, of every fraud and a seeded sample of the genuine rows
    (:func:`.data.iter_eval_chunks`)."""
    was_training = model.training
    model.eval()
    parts = []
    for batch, ids in iter_eval_chunks(root, manifest, split, rank, world, with_ids=True,
                                       negative_rate=negative_rate, seed=seed):
        logits = model(batch.numeric.to(device), batch.categorical.to(device)).float().cpu().numpy()
        times = ids.column(manifest.id_columns[2])
        parts.append(ScoredSplit(
            logits=logits, labels=batch.label.numpy().astype(np.int64),
            card_ids=np.asarray(ids.column(manifest.id_columns[1]).to_pylist(), dtype=str),
            days=np.asarray(pc.strftime(times, format="%Y-%m-%d").to_pylist(), dtype=str),
            transaction_ids=np.asarray(ids.column(manifest.id_columns[0]).to_pylist(), dtype=str),
            event_times=times.to_numpy().astype("datetime64[us]"),
        ))
    model.train(was_training)
    if not parts:
        empty = np.array([], dtype=str)
        return ScoredSplit(np.array([], np.float32), np.array([], np.int64), empty, empty, empty,
                           np.array([], "datetime64[us]"))
    return ScoredSplit.concat(parts)


def gather_scored(local: ScoredSplit) -> ScoredSplit:
    """All ranks' rows, concatenated in rank order, on every rank (collective)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local
    parts: list[ScoredSplit | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    return ScoredSplit.concat([p for p in parts if p is not None])


def split_metrics(scored: ScoredSplit, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                  temperature: float = 1.0, logit_shift: float = 0.0, negative_rate: float = 1.0) -> dict[str, float]:
    """The epochs.jsonl metric set: val_loss (training loss on these rows), AUC-ROC, average precision,
    recall at 1% FPR, card precision@100 and ECE of ``sigmoid((logit + shift) / temperature)``.

    ``negative_rate`` < 1: the rows are every fraud and that share of the genuine ones
    (:func:`score_split`), each genuine row standing for ``1 / negative_rate``. The loss, AUC-ROC, AP
    and recall at 1% FPR are then weighted estimates of the whole split's, and the set holds
    ``validation_negative_rate`` instead of card precision@100 and ECE, which need every row."""
    if negative_rate < 1.0:
        return _sampled_split_metrics(scored, loss_fn, negative_rate)
    logits = torch.from_numpy(scored.logits).float()
    labels = torch.from_numpy(scored.labels).float()
    val_loss = float(loss_fn(logits, labels)) if len(labels) else float("nan")
    probs = torch.sigmoid((logits.double() + logit_shift) / temperature).numpy()
    report = classification_report(scored.labels, probs, scored.card_ids, scored.days)
    return {
        "val_loss": val_loss,
        "auc_roc": report["auc_roc"],
        "average_precision": report["average_precision"],
        "recall_at_1pct_fpr": report["recall_at_1pct_fpr"],
        "card_precision_at_100": report["card_precision_at_100"],
        "ece": report["ece"],
    }


def _sampled_split_metrics(scored: ScoredSplit, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                           negative_rate: float) -> dict[str, float]:
    labels = scored.labels
    weights = importance_weights(labels, negative_rate)
    # The loss is a mean over rows: each class's mean, weighed by the rows that class stands for.
    parts = [(float(w.sum()), float(loss_fn(torch.from_numpy(scored.logits[rows]).float(),
                                            torch.from_numpy(labels[rows]).float())))
             for rows in (labels > 0, labels == 0) if (w := weights[rows]).size]
    total = sum(w for w, _ in parts)
    return {
        "val_loss": sum(w * loss for w, loss in parts) / total if total else float("nan"),
        "auc_roc": auc_roc(labels, scored.logits, weights),
        "average_precision": average_precision(labels, scored.logits, weights),
        "recall_at_1pct_fpr": recall_at_fpr(labels, scored.logits, 0.01, weights),
        "validation_negative_rate": negative_rate,
    }


def scores_table(scored: ScoredSplit, probabilities: np.ndarray) -> pa.Table:
    """validation_scores.parquet rows: transaction_id, card_id, event_time, score, label."""
    return pa.table({
        "transaction_id": scored.transaction_ids.astype(object),
        "card_id": scored.card_ids.astype(object),
        "event_time": pa.array(scored.event_times, pa.timestamp("us", "UTC")),
        "score": probabilities.astype(np.float64),
        "label": scored.labels.astype(np.int64),
    })
