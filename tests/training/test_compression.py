"""Top-k + error-feedback arithmetic (single process; the collective version is in test_comm_hooks)."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.training.compression import (
    GatheredGarbage,
    TopKCompressor,
    clip_norm_,
    densify,
    density_at_step,
    k_for,
    local_clip_threshold,
    select_topk,
)


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


def test_density_schedule_can_start_its_decay_below_dense():
    target, dense, decay = 0.001, 5, 100
    assert density_at_step(4, target, dense, decay, start=0.1) == 1.0  # the dense steps stay dense
    assert density_at_step(5, target, dense, decay, start=0.1) == pytest.approx(0.1)
    assert density_at_step(55, target, dense, decay, start=0.1) == pytest.approx(0.01)  # halfway in log space
    assert density_at_step(105, target, dense, decay, start=0.1) == pytest.approx(target)
    mean = sum(density_at_step(s, target, dense, 100_000, start=0.1) for s in range(5, 100_005)) / 100_000
    assert mean == pytest.approx((0.1 - target) / math.log(0.1 / target), rel=1e-3)  # the docstring's byte count
    assert density_at_step(50, 0.01, 5, 100, start=0.01) == 0.01  # starting at the target: no decay


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


@pytest.mark.parametrize("garbage", [[3, 5], [-1, 0], [2**31 - 1, 1]])
def test_densify_names_the_rank_whose_gathered_indices_cannot_be_a_payload(garbage):
    # What a peer killed mid all-gather leaves behind: gloo returns a partly written buffer.
    values = [torch.tensor([1.0, 2.0]), torch.tensor([4.0, 8.0])]
    with pytest.raises(GatheredGarbage, match="rank 1's indices outside this bucket's 5 values.*left mid-collective"):
        densify(values, [torch.tensor([0, 3]), torch.tensor(garbage)], numel=5, world_size=2)


def test_state_dict_round_trip():
    comp = TopKCompressor(error_feedback=True)
    comp.compress("a.weight", torch.arange(6.0), k=2)
    comp.commit()
    other = TopKCompressor(error_feedback=True)
    other.load_state_dict(comp.state_dict())
    assert torch.equal(other.residuals["a.weight"], comp.residuals["a.weight"])


def test_local_clip_threshold_is_the_global_bound_times_sqrt_ranks_and_bucket_share():
    # Local means of N ranks: N independent ones at norm sqrt(N) * c average to norm c.
    assert local_clip_threshold(1.0, world_size=1) == 1.0
    assert local_clip_threshold(1.0, world_size=4) == 2.0
    assert local_clip_threshold(3.0, world_size=2, share=0.5) == pytest.approx(3.0)
    assert local_clip_threshold(1.0, world_size=2, share=0.125) == pytest.approx(0.5)


def test_clip_norm_scales_down_to_the_bound_and_leaves_smaller_gradients_alone():
    grad = torch.tensor([3.0, -4.0])
    assert clip_norm_(grad, 1.0).item() == 5.0  # the norm before
    torch.testing.assert_close(grad, torch.tensor([0.6, -0.8]), rtol=1e-5, atol=0)
    small = torch.tensor([0.3, 0.4])
    clip_norm_(small, 1.0)
    assert torch.equal(small, torch.tensor([0.3, 0.4]))


def test_clip_norm_keeps_a_nonfinite_gradient_visible():
    for bad in (float("nan"), float("inf")):
        grad = torch.tensor([1.0, bad, 2.0])
        clip_norm_(grad, 1.0)
        assert not torch.isfinite(grad).all()


def test_clipped_gradient_is_what_error_feedback_conserves():
    comp = TopKCompressor(error_feedback=True)
    comp.residuals["p"] = torch.tensor([0.5, 0.0, 0.0, 0.1])
    grad = torch.tensor([0.0, 6.0, 8.0, 0.0])  # norm 10, clipped to 1: [0, 0.6, 0.8, 0]
    clip_norm_(grad, 1.0)
    values, indices = comp.compress("p", grad, k=2)
    comp.commit()
    sent = torch.zeros(4).index_add_(0, indices, values)
    assert sorted(indices.tolist()) == [1, 2]
    assert torch.equal(sent + comp.residuals["p"], torch.tensor([0.5, 0.0, 0.0, 0.1]) + grad)
    torch.testing.assert_close(comp.residuals["p"], torch.tensor([0.5, 0.0, 0.0, 0.1]))


def test_selection_weights_choose_entries_but_the_raw_values_are_sent_and_conserved():
    comp = TopKCompressor(error_feedback=True)
    comp.selection_weights = {"p": torch.tensor([10.0, 1.0, 1.0, 10.0])}
    grad = torch.tensor([1.0, -2.0, 3.0, 0.5])  # weighted magnitudes 10, 2, 3, 5
    values, indices = comp.compress("p", grad, k=2)
    comp.commit()
    assert sorted(zip(indices.tolist(), values.tolist(), strict=True)) == [(0, 1.0), (3, 0.5)]
    sent = torch.zeros(4).index_add_(0, indices, values)
    assert torch.equal(sent + comp.residuals["p"], grad)
    values, indices = comp.compress("q", grad, k=1)  # no weights for q: raw magnitude
    assert indices.tolist() == [2]
