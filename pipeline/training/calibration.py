"""Probability calibration on validation logits: temperature scaling with a bias term.

``p = sigmoid((logit + shift) / temperature)``. Temperature alone rescales confidence; the shift
removes the constant offset that class weighting puts into the logits (a weight w moves the
optimal logit by log w). The shift is folded into the model's output bias and the temperature
into its ``temperature`` buffer, so a saved model needs nothing new to score calibrated.

Calibrated means: at validation's fraud rate. Where the rate moves (a fraud wave), scores are
re-calibrated without labels by a prior-shift correction, :mod:`pipeline.decisions.prior_shift`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.fraud_mlp import FraudModel


@dataclass(frozen=True)
class Calibration:
    temperature: float
    logit_shift: float
    extra_weight: float = 0.0  # weight of a second log-odds input (a blend's boosted term), 0 without one


def fit_calibration(logits: torch.Tensor, labels: torch.Tensor, iters: int = 100,
                    extra: torch.Tensor | None = None) -> Calibration:
    """Minimise the validation log-loss of ``sigmoid(a * logit + w * extra + b)`` (``w`` only with
    ``extra``: a blend's boosted term, stacked by the same fit that calibrates); returns T = 1/a,
    shift = b/a and w. Identity when the labels hold one class only (no evidence to calibrate on)."""
    z, y = logits.double().detach(), labels.double().detach()
    if not 0 < float(y.sum()) < y.numel():
        return Calibration(temperature=1.0, logit_shift=0.0)  # one class only: nothing to fit
    g = torch.zeros_like(z) if extra is None else extra.double().detach()
    log_a = torch.zeros((), dtype=torch.float64, requires_grad=True)  # a = exp(log_a) > 0 keeps order
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    w = torch.zeros((), dtype=torch.float64, requires_grad=extra is not None)
    opt = torch.optim.LBFGS([log_a, b] + ([w] if extra is not None else []), lr=0.5, max_iter=iters,
                            line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(torch.exp(log_a) * z + w * g + b, y)
        loss.backward()
        return loss

    opt.step(closure)
    a = float(torch.exp(log_a.detach()))
    return Calibration(temperature=1.0 / a, logit_shift=float(b.detach()) / a, extra_weight=float(w.detach()))


@torch.no_grad()
def apply_calibration(model: FraudModel, calibration: Calibration) -> None:
    """Fold the calibration into ``model``: shift the output bias, set the temperature buffer."""
    head = model.head[-1]
    head.bias.add_(calibration.logit_shift)
    model.temperature.fill_(calibration.temperature)
