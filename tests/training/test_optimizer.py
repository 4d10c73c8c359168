"""FreezableAdamW: AdamW unfrozen, a fixed preconditioner frozen (hand-computed values)."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.training.optimizer import FreezableAdamW, adamw_update_

LR, BETAS, EPS = 0.1, (0.9, 0.999), 1e-8


def _state(value: float = 0.0) -> dict:
    return {"step": 0, "variance_step": 0, "exp_avg": torch.zeros(1), "exp_avg_sq": torch.full((1,), value)}


def test_unfrozen_is_torch_adamw_bit_for_bit():
    torch.manual_seed(0)
    ours_model, torch_model = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    torch_model.load_state_dict(ours_model.state_dict())
    ours = FreezableAdamW(ours_model.parameters(), lr=1e-2, weight_decay=0.05)
    reference = torch.optim.AdamW(torch_model.parameters(), lr=1e-2, weight_decay=0.05, foreach=False)
    for _ in range(20):
        x = torch.randn(8, 5)
        for model, opt in ((ours_model, ours), (torch_model, reference)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    for a, b in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_frozen_step_keeps_the_variance_and_its_bias_correction():
    param, state = torch.zeros(1), _state()
    adamw_update_(param, torch.tensor([2.0]), state, LR, BETAS, EPS, 0.0, freeze_variance=False)
    # m = 0.2, v = 0.004; corrected 2 and 4: the first Adam step is lr * 2 / 2.
    assert param.item() == pytest.approx(-LR)
    adamw_update_(param, torch.tensor([4.0]), state, LR, BETAS, EPS, 0.0, freeze_variance=True)
    # m = 0.9 * 0.2 + 0.1 * 4 = 0.58, corrected by 1 - 0.9^2 = 0.19; v_hat stays 4 -> denominator 2.
    assert param.item() == pytest.approx(-LR - LR * (0.58 / 0.19) / 2, rel=1e-6)
    assert state["exp_avg_sq"].item() == pytest.approx(0.004)
    assert (state["step"], state["variance_step"]) == (2, 1)


def test_unfrozen_second_step_differs_from_the_frozen_one():
    param, state = torch.zeros(1), _state()
    adamw_update_(param, torch.tensor([2.0]), state, LR, BETAS, EPS, 0.0, freeze_variance=False)
    adamw_update_(param, torch.tensor([4.0]), state, LR, BETAS, EPS, 0.0, freeze_variance=False)
    v_hat = (0.999 * 0.004 + 0.001 * 16) / (1 - 0.999 ** 2)
    assert param.item() == pytest.approx(-LR - LR * (0.58 / 0.19) / math.sqrt(v_hat), rel=1e-6)


def test_an_entry_without_variance_takes_its_first_gradients_square_when_frozen():
    param, state = torch.zeros(2), {"step": 0, "variance_step": 0, "exp_avg": torch.zeros(2),
                                    "exp_avg_sq": torch.zeros(2)}
    adamw_update_(param, torch.tensor([2.0, 0.0]), state, LR, BETAS, EPS, 0.0, freeze_variance=False)
    adamw_update_(param, torch.tensor([2.0, 3.0]), state, LR, BETAS, EPS, 0.0, freeze_variance=True)
    # Entry 1: m = 0.3, corrected 0.3 / 0.19; v_hat = 3^2 (not 0, which would divide by eps).
    assert param[1].item() == pytest.approx(-LR * (0.3 / 0.19) / 3.0, rel=1e-6)
    assert state["exp_avg_sq"][1].item() == pytest.approx(9.0 * (1 - 0.999))


def test_frozen_updates_are_linear_so_a_delayed_gradient_moves_the_weights_as_far():
    """What error feedback needs: 10 steps' gradient sent at once moves the weights as far as sent
    step by step (beta1 = 0 and no weight decay, so each step's move is its own)."""
    betas = (0.0, 0.999)
    g = torch.tensor([0.3, 0.1, -0.2])

    def moved(grads: list[torch.Tensor], freeze: bool) -> torch.Tensor:
        param, state = torch.zeros(3), {"step": 0, "variance_step": 0, "exp_avg": torch.zeros(3),
                                        "exp_avg_sq": torch.zeros(3)}
        adamw_update_(param, torch.tensor([1.0, -2.0, 0.5]), state, LR, betas, EPS, 0.0, freeze_variance=False)
        start = param.clone()
        for grad in grads:
            adamw_update_(param, grad, state, LR, betas, EPS, 0.0, freeze_variance=freeze)
        return param - start

    on_time, delayed = [g] * 10, [10 * g] + [torch.zeros(3)] * 9
    torch.testing.assert_close(moved(delayed, freeze=True), moved(on_time, freeze=True))
    # Adam's variance absorbs the delivery: in all, it moves the weights less than half as far.
    assert moved(delayed, freeze=False).abs().sum() < 0.5 * moved(on_time, freeze=False).abs().sum()


def test_state_round_trip_and_a_torch_adamw_checkpoint_loads():
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 1)
    reference = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 3)).sum().backward()
    reference.step()
    ours = FreezableAdamW(model.parameters(), lr=1e-2)
    ours.load_state_dict(reference.state_dict())
    ours.param_groups[0]["freeze_variance"] = True
    ours.step()
    state = ours.state[model.weight]
    assert (state["step"], state["variance_step"]) == (2, 1)  # the torch checkpoint's step counted as variance steps
    again = FreezableAdamW(model.parameters(), lr=1e-2)
    again.load_state_dict(ours.state_dict())
    assert again.state[model.weight]["variance_step"] == 1
    assert torch.equal(again.state[model.weight]["exp_avg_sq"], state["exp_avg_sq"])


def test_preconditioner_is_one_over_the_corrected_variance_root():
    param = torch.nn.Parameter(torch.zeros(3))
    opt = FreezableAdamW([param], lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0)
    assert opt.preconditioner(param) is None  # no step yet
    param.grad = torch.tensor([2.0, 4.0, 0.0])
    opt.step()
    # v_hat = g^2 after one step: 4 and 16; the entry without variance takes their mean, 20 / 3.
    expected = torch.tensor([1 / 2.0, 1 / 4.0, 1 / math.sqrt(20 / 3)])
    torch.testing.assert_close(opt.preconditioner(param), expected, rtol=1e-6, atol=0)
