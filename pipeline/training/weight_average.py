"""Exponential moving average of the model's parameters: the weights that are validated and exported.

Validation average precision on a few hundred frauds jumps by several points from one epoch to the
next with the raw weights; the average of the recent steps ranks better and moves smoothly, so
early stopping picks a real optimum rather than a lucky epoch. Every rank applies the same update
to identical parameters, so the averages agree across ranks without communication.

The decay ramps up as ``min(decay, (1 + n) / (10 + n))`` after ``n`` updates, so the random
initialisation is forgotten within the first steps; ``n`` is the optimizer step, part of the
trainer state, so a resumed run continues the exact average.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def decay_at_update(update: int, decay: float) -> float:
    """Weight of the old average at the ``update``-th (0-based) update."""
    return min(decay, (1.0 + update) / (10.0 + update))


class WeightAverage:
    """Shadow copies of ``model``'s parameters (not buffers: those never change while training)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.model, self.decay = model, decay
        self.shadow = [p.detach().clone() for p in model.parameters()]

    @torch.no_grad()
    def update(self, update: int) -> None:
        """Blend the model's current parameters into the average (after optimizer step ``update``)."""
        weight = 1.0 - decay_at_update(update, self.decay)
        for shadow, param in zip(self.shadow, self.model.parameters(), strict=True):
            shadow.lerp_(param.detach(), weight)

    @torch.no_grad()
    def load(self, tensors: list[torch.Tensor]) -> None:
        for shadow, value in zip(self.shadow, tensors, strict=True):
            shadow.copy_(value)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The model holds the averaged parameters inside the block, its own ones again after it."""
        params = list(self.model.parameters())
        live = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, shadow in zip(params, self.shadow, strict=True):
                p.copy_(shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, value in zip(params, live, strict=True):
                    p.copy_(value)
