"""The monitored day as one PNG: a row per model version with its live vs validation score
distribution (log-odds, the thresholds marked), its per-feature PSI and its recall history.

Matplotlib headless (Agg), as :mod:`pipeline.evaluation.plots`.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on the hosts that run the monitor; must precede pyplot

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from pipeline.atomic import atomic_path  # noqa: E402
from pipeline.monitoring.history import MonitoredDay  # noqa: E402
from pipeline.monitoring.report import VersionReport  # noqa: E402

MAX_ROWS = 4  # versions drawn; the report lists them all
SHOWN_FEATURES = 15


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p) - np.log1p(-p)


def _scores_panel(ax, live: np.ndarray, validation: np.ndarray | None, v: VersionReport) -> None:
    logits = np.r_[_logit(live), _logit(validation) if validation is not None else []]
    bins = np.linspace(np.floor(logits.min()) - 1, np.ceil(logits.max()) + 1, 51)
    ax.hist(_logit(live), bins=bins, density=True, alpha=0.6, label=f"live ({live.size})")
    if validation is not None and validation.size:
        ax.hist(_logit(validation), bins=bins, density=True, alpha=0.5, label=f"validation ({validation.size})")
    for name, thresholds, colour in (("review", v.figures.review_thresholds, "orange"),
                                     ("block", v.figures.block_thresholds, "red")):
        for t in thresholds[:1]:
            ax.axvline(_logit(np.array([t]))[0], color=colour, linewidth=1, label=f"{name} >= {t:.3g}")
    ax.set(xlabel="score (log-odds)", ylabel="density", yscale="log",
           title=f"v{v.version}: scores (PSI {v.figures.score_psi:.3f})")
    ax.legend(fontsize=7)


def _features_panel(ax, v: VersionReport, warn: float) -> None:
    items = sorted(((psi, name) for name, psi in v.figures.feature_psi.items() if np.isfinite(psi)), reverse=True)
    items = items[:SHOWN_FEATURES]
    ax.barh([n for _, n in items][::-1], [p for p, _ in items][::-1])
    ax.axvline(warn, color="red", linestyle="--", linewidth=0.8)
    ax.set(xlabel="PSI vs training split", title="served features")
    ax.tick_params(axis="y", labelsize=6)


def _recall_panel(ax, history: list[MonitoredDay], v: VersionReport) -> None:
    days = [d for d in history if d.recall is not None]
    ax.plot([d.date for d in days], [d.recall for d in days], marker="o", label="realised recall")
    below = [d for d in days if d.below]
    ax.scatter([d.date for d in below], [d.recall for d in below], color="red", zorder=3, label="below floor")
    if v.day.expected_recall is not None:
        ax.axhline(v.day.expected_recall, color="grey", linestyle="--", label="expected")
        ax.axhline(v.day.recall_floor, color="red", linestyle=":", label="floor")
    ax.set(ylim=(0, 1.02), title=f"recall at the operating points: {v.state}")
    ax.tick_params(axis="x", labelrotation=45, labelsize=6)
    ax.legend(fontsize=7)


def write_plot(path: Path, versions: list[tuple[VersionReport, np.ndarray, np.ndarray | None, list[MonitoredDay]]],
               feature_psi_warn: float) -> Path:
    """``versions``: (report, live scores, validation scores, history) each; writes ``path`` atomically."""
    shown = versions[:MAX_ROWS]
    fig, axes = plt.subplots(len(shown), 3, figsize=(15, 4 * len(shown)), squeeze=False)
    for row, (v, live, validation, history) in zip(axes, shown, strict=True):
        _scores_panel(row[0], live, validation, v)
        _features_panel(row[1], v, feature_psi_warn)
        _recall_panel(row[2], history, v)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.12, top=0.92, wspace=0.35, hspace=0.6)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)
    return path
