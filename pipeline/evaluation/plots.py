"""PNG plots logged with each training run: ROC, precision-recall, calibration, score histogram by
class (from the validation scores) and training curves (from the step and epoch metrics).

Matplotlib runs headless (Agg). Each function writes one file and returns its path; the curve data
come from scikit-learn, the single-number metrics shown in titles from :mod:`pipeline.metrics`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on training hosts; must precede pyplot

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.calibration import calibration_curve  # noqa: E402
from sklearn.metrics import precision_recall_curve, roc_curve  # noqa: E402

from pipeline.metrics import auc_roc, average_precision, expected_calibration_error  # noqa: E402


def _save(fig, path: Path) -> Path:
    # Fixed margins instead of tight_layout(): same look for these simple plots, a third of the time.
    fig.subplots_adjust(left=0.14, bottom=0.12, right=0.97, top=0.92, wspace=0.3)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot_roc(labels: np.ndarray, scores: np.ndarray, path: Path) -> Path:
    fpr, tpr, _ = roc_curve(labels, scores)
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot(fpr, tpr, label=f"model (AUC {auc_roc(labels, scores):.4f})")
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", label="chance")
    ax.axvline(0.01, color="red", linewidth=0.8, label="1% FPR")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC (validation)")
    ax.legend(loc="lower right")
    return _save(fig, path)


def plot_precision_recall(labels: np.ndarray, scores: np.ndarray, path: Path) -> Path:
    precision, recall, _ = precision_recall_curve(labels, scores)
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.step(recall, precision, where="post", label=f"model (AP {average_precision(labels, scores):.4f})")
    ax.axhline(labels.mean(), linestyle="--", color="grey", label=f"fraud rate {labels.mean():.4f}")
    ax.set(xlabel="recall", ylabel="precision", title="Precision-recall (validation)", ylim=(0, 1.02))
    ax.legend(loc="upper right")
    return _save(fig, path)


def plot_calibration(labels: np.ndarray, scores: np.ndarray, path: Path, bins: int = 15) -> Path:
    # Quantile bins: fraud scores crowd near 0, equal-width bins would leave most of them empty.
    observed, predicted = calibration_curve(labels, scores, n_bins=bins, strategy="quantile")
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot(predicted, observed, marker="o", label=f"model (ECE {expected_calibration_error(labels, scores):.4f})")
    top = max(float(predicted.max(initial=0)), float(observed.max(initial=0)), 1e-3)
    ax.plot([0, top], [0, top], linestyle="--", color="grey", label="perfect calibration")
    ax.set(xlabel="mean predicted probability", ylabel="observed fraud rate", title="Calibration (validation)")
    ax.legend(loc="upper left")
    return _save(fig, path)


def plot_score_histogram(labels: np.ndarray, scores: np.ndarray, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    bins = np.linspace(0, 1, 51)
    # Density per class: frauds are a tiny share, raw counts would hide their distribution.
    ax.hist(scores[labels == 0], bins=bins, density=True, alpha=0.6, label="genuine")
    ax.hist(scores[labels == 1], bins=bins, density=True, alpha=0.6, label="fraud")
    ax.set(xlabel="fraud probability", ylabel="density", title="Score distribution by class (validation)",
           yscale="log")
    ax.legend()
    return _save(fig, path)


def plot_training_curves(steps: list[dict[str, Any]], epochs: list[dict[str, Any]], path: Path) -> Path:
    fig, (loss_ax, val_ax) = plt.subplots(1, 2, figsize=(10, 4))
    if steps:
        loss_ax.plot([s["step"] for s in steps], [s.get("loss", np.nan) for s in steps], label="train loss")
    if epochs:
        loss_ax.plot([e["step"] for e in epochs], [e.get("val_loss", np.nan) for e in epochs],
                     marker="o", label="validation loss")
        for key in ("auc_roc", "average_precision", "recall_at_1pct_fpr"):
            val_ax.plot([e["epoch"] for e in epochs], [e.get(key, np.nan) for e in epochs], marker="o", label=key)
    loss_ax.set(xlabel="step", ylabel="loss", title="Loss")
    val_ax.set(xlabel="epoch", ylabel="metric", title="Validation metrics", ylim=(0, 1.02))
    loss_ax.legend()
    val_ax.legend()
    return _save(fig, path)


def write_score_plots(labels: np.ndarray, scores: np.ndarray, out_dir: Path) -> list[Path]:
    """ROC, PR, calibration and histogram PNGs of one scored set into ``out_dir``."""
    labels = np.asarray(labels, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    return [
        plot_roc(labels, scores, out_dir / "roc.png"),
        plot_precision_recall(labels, scores, out_dir / "precision_recall.png"),
        plot_calibration(labels, scores, out_dir / "calibration.png"),
        plot_score_histogram(labels, scores, out_dir / "score_histogram.png"),
    ]
