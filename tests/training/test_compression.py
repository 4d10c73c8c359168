"""Top-k + error-feedback arithmetic (single process; the collective version is in test_comm_hooks)."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.training.compression import TopKCompressor, densify, density_at_step, k_for, select_topk


def test_k_is_ceil_of_density_times_size_at_least_one():
    assert k_for(1000, 0.01) == 10
    assert k_for(1000, 0.001) == 1
    assert k_for(10, 0.001) == 1
    assert k_for(1001, 0.01) == 11
    assert k_for(7, 1.0) == 7


def test_density_schedule_dense_then_exponential_decay_to_target():
    target, dense, decay = 0.001, 5, 100
    assert density_at_step(0, target, dense, decay) == 1.0
    assert density_at_step(4, target, dense, decay) == 1.0
    assert density_at_step(5, target, dense, decay) == pytest.approx(1.0)
    assert density_at_step(55, target, dense, decay) == pytest.approx(math.sqrt(target))  # halfway in log space
    assert density_at_step(105, target, dense, decay) == pytest.approx(target)
    assert density_at_step(10_000, target, dense, decay) == target
    values = [density_at_step(s, target, dense, decay) for s in range(5, 106)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    assert density_at_step(7, 0.01, 5, 0) == 0.01  # no sparsity warm-up configured


def test_select_topk_takes_largest_magnitudes_and_nan_first():
    acc = torch.tensor([0.1, -5.0, 3.0, 0.0, -0.2])
    values, indices = select_topk(acc, 2)
    assert sorted(indices.tolist()) == [1, 2]
    assert sorted(values.tolist()) == [-5.0, 3.0]
    values, indices = select_topk(torch.tensor([1.0, float("nan"), 2.0]), 1)
    assert indices.tolist() == [1] and math.isnan(values.item())


def test_error_feedback_conserves_mass_exactly_in_one_step():
    torch.manual_seed(0)
    comp = TopKCompressor(error_feedback=True)
    comp.residuals["w"] = torch.randn(50)
    grad = torch.randn(50)
    acc = comp.residuals["w"] + grad
    values, indices = comp.compress("w", grad, k=7)
    comp.commit()
    sent = torch.zeros(50).index_add_(0, indices, values)
    # Exact (bitwise): entries are copied to `sent` or kept in the residual, never rounded.
    assert torch.equal(sent + comp.residuals["w"], acc)
    assert torch.count_nonzero(comp.residuals["w"][indices]) == 0


def test_error_feedback_delays_but_never_loses_gradient_over_many_steps():
    torch.manual_seed(1)
    comp = TopKCompressor(error_feedback=True)
    total_grad, total_sent = torch.zeros(200, dtype=torch.float64), torch.zeros(200, dtype=torch.float64)
    for _ in range(30):
        g = torch.randn(200)
        total_grad += g.double()
        values, indices = comp.compress("p", g, k=5)
        comp.commit()
        total_sent.index_add_(0, indices, values.double())
    # Over steps the float32 additions round, so equality holds to float32 precision, not bitwise.
    torch.testing.assert_close(total_sent + comp.residuals["p"].double(), total_grad, rtol=0, atol=1e-4)


def test_without_error_feedback_the_unsent_part_is_dropped():
    comp = TopKCompressor(error_feedback=False)
    values, indices = comp.compress("p", torch.tensor([1.0, 2.0, 3.0]), k=1)
    comp.commit()
    assert comp.residuals == {}
    assert indices.tolist() == [2] and values.tolist() == [3.0]


def test_discard_keeps_previous_residual_and_nonfinite_acc_is_not_staged():
    comp = TopKCompressor(error_feedback=True)
    comp.compress("p", torch.tensor([1.0, 2.0, 3.0]), k=1)
    comp.commit()
    before = comp.residuals["p"].clone()
    comp.compress("p", torch.tensor([5.0, 5.0, 5.0]), k=1)
    comp.discard()
    assert torch.equal(comp.residuals["p"], before)
    comp.compress("p", torch.tensor([float("nan"), 0.0, 0.0]), k=1)
    comp.commit()
    assert torch.equal(comp.residuals["p"], before)


def test_fold_residual_adds_it_into_a_dense_step_and_zeroes_it():
    comp = TopKCompressor(error_feedback=True)
    comp.residuals["p"] = torch.tensor([0.5, -1.0])
    grad = torch.tensor([1.0, 1.0])
    comp.fold_residual("p", grad)
    comp.commit()
    assert grad.tolist() == [1.5, 0.0]
    assert comp.residuals["p"].tolist() == [0.0, 0.0]


def test_densify_sums_indices_chosen_by_several_ranks_and_averages():
    values = [torch.tensor([1.0, 2.0]), torch.tensor([4.0, 8.0])]
    indices = [torch.tensor([0, 3]), torch.tensor([3, 1])]
    out = densify(values, indices, numel=5, world_size=2)
    assert out.tolist() == [0.5, 4.0, 0.0, 3.0, 0.0]  # index 3: (2 + 4) / 2


def test_state_dict_round_trip():
    comp = TopKCompressor(error_feedback=True)
    comp.compress("a.weight", torch.arange(6.0), k=2)
    comp.commit()
    other = TopKCompressor(error_feedback=True)
    other.load_state_dict(comp.state_dict())
    assert torch.equal(other.residuals["a.weight"], comp.residuals["a.weight"])
