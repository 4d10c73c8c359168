"""AdamW with a frozen-variance mode, for training on sparse (top-k, error-feedback) gradients.

Adam divides each entry's step by the root of its second moment ``v``. A top-k step delivers a few
entries carrying many steps' accumulated gradient and zeros elsewhere; the delivery inflates its own
entries' ``v``, so Adam moves the weights far less for T steps' gradient delivered at once than for
the same gradient delivered step by step -- why error feedback did no better than dropping the
unsent part under AdamW. 1-bit Adam (Tang et al. 2021) estimates ``v`` during a dense warm-up and
then freezes it: the update becomes momentum SGD with a fixed per-entry preconditioner, linear in
the gradient, so delayed mass moves the weights as far as it would have on time.

``group["freeze_variance"]`` (set by the trainer per step, like ``lr``) switches the mode. While
frozen, ``v`` and its bias correction stand still; an entry whose ``v`` is still 0 (no gradient
during the warm-up, e.g. an unseen category's embedding row) takes its first gradient's square, as
Adam's first step would, instead of dividing by ``eps``. Unfrozen, the update is torch.optim.AdamW's
(decoupled weight decay, bias-corrected moments, no amsgrad).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def adamw_update_(param: torch.Tensor, grad: torch.Tensor, state: dict, lr: float, betas: tuple[float, float],
                  eps: float, weight_decay: float, freeze_variance: bool) -> None:
    """One AdamW step of ``param`` in place; ``state`` holds ``exp_avg``, ``exp_avg_sq`` (tensors),
    ``step`` and ``variance_step`` (the steps ``exp_avg_sq`` took part in) and is updated in place."""
    beta1, beta2 = betas
    state["step"] += 1
    param.mul_(1 - lr * weight_decay)
    state["exp_avg"].lerp_(grad, 1 - beta1)
    exp_avg_sq = state["exp_avg_sq"]
    if freeze_variance and state["variance_step"] > 0:
        bias_correction2 = 1 - beta2 ** state["variance_step"]
        unseen = exp_avg_sq == 0
        exp_avg_sq.copy_(torch.where(unseen, grad * grad * bias_correction2, exp_avg_sq))
    else:
        state["variance_step"] += 1
        bias_correction2 = 1 - beta2 ** state["variance_step"]
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1 ** state["step"])
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
    param.addcdiv_(state["exp_avg"], denom, value=-step_size)


class FreezableAdamW(torch.optim.Optimizer):
    """AdamW whose second moment freezes while ``param_groups[i]["freeze_variance"]`` is true."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "freeze_variance": False})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state.update(step=0, variance_step=0, exp_avg=torch.zeros_like(param),
                                 exp_avg_sq=torch.zeros_like(param))
                # A checkpoint of torch.optim.AdamW holds ``step`` as a tensor and no variance_step.
                state["step"] = int(state["step"])
                state.setdefault("variance_step", state["step"])
                adamw_update_(param, param.grad, state, group["lr"], group["betas"], group["eps"],
                              group["weight_decay"], group.get("freeze_variance", False))
        return loss

    @torch.no_grad()
    def preconditioner(self, param: torch.Tensor) -> torch.Tensor | None:
        """``1 / (sqrt(v_hat) + eps)`` of ``param`` (entries with no variance yet take the tensor's mean
        one): how far a unit of gradient moves each entry, once the variance is frozen."""
        state = self.state.get(param)
        if not state or state["variance_step"] == 0:
            return None
        group = next(g for g in self.param_groups if any(p is param for p in g["params"]))
        v_hat = state["exp_avg_sq"] / (1 - group["betas"][1] ** state["variance_step"])
        v_hat = torch.where(v_hat > 0, v_hat, v_hat.mean())
        return 1.0 / (v_hat.sqrt() + group["eps"])
