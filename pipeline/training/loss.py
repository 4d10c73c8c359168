"""Imbalance-aware binary losses on logits: class-weighted BCE and focal loss.

Logits and labels have the same shape, ``[B]`` or ``[B, members]`` (each ensemble member's logit
against the row's label); the loss is the mean over all entries, so over members it is the mean of
the members' own losses.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pipeline.training.config import OptimConfig


def positive_weight(config: OptimConfig, positives: int, negatives: int) -> float:
    """The configured weight, or sqrt(negatives / positives) when it is <= 0 (auto)."""
    if config.pos_weight > 0:
        return config.pos_weight
    return math.sqrt(negatives / max(positives, 1))


def weighted_bce(logits: torch.Tensor, labels: torch.Tensor, pos_weight: float) -> torch.Tensor:
    weight = torch.tensor(pos_weight, dtype=logits.dtype, device=logits.device)
    return F.binary_cross_entropy_with_logits(logits, labels, pos_weight=weight)


def focal_loss(logits: torch.Tensor, labels: torch.Tensor, gamma: float, alpha: float) -> torch.Tensor:
    """Lin et al. 2017: ``-alpha_t (1 - p_t)^gamma log(p_t)``, mean over the batch."""
    bce = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    p_t = torch.exp(-bce)
    alpha_t = alpha * labels + (1 - alpha) * (1 - labels)
    return (alpha_t * (1 - p_t).pow(gamma) * bce).mean()


def make_loss(config: OptimConfig, positives: int, negatives: int, positive_scale: float = 1.0):
    """``loss(logits, labels) -> scalar`` for the configured kind. ``positive_scale`` multiplies the
    positive weight of weighted BCE (importance weights of a negative sample: its rate)."""
    if config.loss == "focal":
        return lambda logits, labels: focal_loss(logits, labels, config.focal_gamma, config.focal_alpha)
    w = positive_weight(config, positives, negatives) * positive_scale
    return lambda logits, labels: weighted_bce(logits, labels, w)
