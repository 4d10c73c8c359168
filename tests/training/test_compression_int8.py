"""int8 quantization and top-k with int8 values: the arithmetic (single process; the collective
version is in test_comm_hooks_int8)."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.training.compression import (
    ErrorFeedback,
    GatheredGarbage,
    TopKCompressor,
    bucket_indices,
    chunk_ids,
    chunk_scales,
    dequantize_int8,
    offset_dtype,
    quantize_int8,
    rounding_noise,
    rounding_seed,
)


def test_chunks_never_cross_a_parameter_boundary():
    # Segments of 3 and 5 entries, chunks of 2: [0 0 1] [2 2 3 3 4].
    assert chunk_ids([3, 5], 2).tolist() == [0, 0, 1, 2, 2, 3, 3, 4]
    assert chunk_ids([4], 4).tolist() == [0, 0, 0, 0]


def test_chunk_scale_is_the_largest_magnitude_over_127():
    x = torch.tensor([1.27, -2.54, 0.0, 0.0, 0.5])
    scales = chunk_scales(x, chunk_ids([2, 2, 1], 2), 3)
    torch.testing.assert_close(scales, torch.tensor([0.02, 0.0, 0.5 / 127]))


def test_stochastic_rounding_goes_up_with_probability_of_the_fraction():
    # Scale 0.25: 1.625 sits at level 6.5, -1.625 at -6.5, 31.75 at the top level 127.
    x = torch.tensor([1.625, -1.625, 31.75])
    scale = torch.tensor(0.25)
    assert quantize_int8(x, scale, torch.tensor([0.4, 0.4, 0.99])).tolist() == [6, -7, 127]
    assert quantize_int8(x, scale, torch.tensor([0.6, 0.6, 0.0])).tolist() == [7, -6, 127]
    assert quantize_int8(x, scale, torch.tensor([0.6, 0.6, 0.0])).dtype == torch.int8
    assert dequantize_int8(torch.tensor([7, -6], dtype=torch.int8), scale).tolist() == [1.75, -1.5]


def test_quantized_levels_stay_in_range_at_the_extremes():
    torch.manual_seed(0)
    x = torch.randn(1000) * 3
    chunks = chunk_ids([1000], 100)
    scales = chunk_scales(x, chunks, 10)
    q = quantize_int8(x, scales[chunks], torch.full((1000,), 1 - 1e-7))  # noise as high as it goes
    assert int(q.max()) <= 127 and int(q.min()) >= -127


def test_stochastic_rounding_is_unbiased_over_many_draws():
    torch.manual_seed(1)
    x = torch.randn(64)
    chunks = chunk_ids([40, 24], 16)
    scale = chunk_scales(x, chunks, int(chunks[-1]) + 1)[chunks]
    draws = 20_000
    mean = dequantize_int8(quantize_int8(x, scale, torch.rand(draws, 64)), scale).double().mean(0)
    # One draw is within one grid step (variance <= scale^2 / 4): the mean of n is within 5 sigma.
    tolerance = 5 * scale.double() / (2 * math.sqrt(draws))
    assert bool(((mean - x.double()).abs() <= tolerance).all())
    # Round-to-nearest would be biased: 0.3 of a step always rounds to 0.
    small = torch.tensor([0.3 * float(scale[0])])
    sr = dequantize_int8(quantize_int8(small, scale[:1], torch.rand(draws, 1)), scale[:1]).double().mean()
    assert float(sr) == pytest.approx(float(small), rel=0.05)


def test_a_nonfinite_entry_makes_its_chunk_nonfinite_and_leaves_the_others_alone():
    x = torch.tensor([1.0, float("nan"), 2.0, 3.0, 4.0, float("inf")])
    chunks = chunk_ids([6], 2)
    scales = chunk_scales(x, chunks, 3)
    out = dequantize_int8(quantize_int8(x, scales[chunks], torch.zeros(6)), scales[chunks])
    assert not torch.isfinite(out[:2]).any() and not torch.isfinite(out[4:]).any()
    assert bool(((out[2:4] - x[2:4]).abs() <= scales[1]).all())  # within one grid step (noise 0 floors)


def test_rounding_noise_is_a_pure_function_of_seed_rank_step_and_name():
    segments = [("a.weight", 5), ("b.bias", 3)]
    first = rounding_noise(segments, seed=7, rank=0, step=3)
    assert torch.equal(first, rounding_noise(segments, seed=7, rank=0, step=3))
    assert torch.equal(first[5:], rounding_noise([("b.bias", 3)], seed=7, rank=0, step=3))  # per parameter
    assert not torch.equal(first, rounding_noise(segments, seed=7, rank=1, step=3))
    assert not torch.equal(first, rounding_noise(segments, seed=7, rank=0, step=4))
    assert 0 <= rounding_seed(7, 0, 3, "a.weight") < 2**63
    assert bool(((first >= 0) & (first < 1)).all())


def test_int8_error_feedback_keeps_the_rounding_error():
    torch.manual_seed(2)
    feedback = ErrorFeedback(error_feedback=True)
    total_grad, total_sent = torch.zeros(300, dtype=torch.float64), torch.zeros(300, dtype=torch.float64)
    chunks = chunk_ids([300], 64)
    for step in range(20):
        grad = torch.randn(300)
        total_grad += grad.double()
        acc = feedback.accumulate("p", grad)
        scale = chunk_scales(acc, chunks, 5)[chunks]
        sent = dequantize_int8(quantize_int8(acc, scale, rounding_noise([("p", 300)], 0, 0, step)), scale)
        feedback.stage("p", acc - sent)
        feedback.commit()
        total_sent += sent.double()
        assert bool((feedback.residuals["p"].abs() <= scale * (1 + 1e-6)).all())  # less than a grid step
    torch.testing.assert_close(total_sent + feedback.residuals["p"].double(), total_grad, rtol=0, atol=1e-4)


def test_a_nonfinite_residual_is_never_staged_and_without_error_feedback_none_is():
    feedback = ErrorFeedback(error_feedback=True)
    feedback.stage("p", torch.tensor([1.0, float("nan")]))
    assert feedback.staged == {}
    plain = ErrorFeedback(error_feedback=False)
    plain.stage("p", torch.tensor([1.0]))
    assert plain.staged == {} and torch.equal(plain.accumulate("p", torch.tensor([2.0])), torch.tensor([2.0]))


def test_topk_int8_error_feedback_keeps_what_quantization_took_off_the_sent_values():
    comp = TopKCompressor(error_feedback=True)
    grad = torch.tensor([0.1, -3.0, 1.0, 0.0, 2.0])
    values, indices = comp.compress("p", grad, k=3)  # -3, 2, 1
    scale = chunk_scales(values, torch.zeros(3, dtype=torch.long), 1)  # 3 / 127
    sent = dequantize_int8(quantize_int8(values, scale, torch.full((3,), 0.5)), scale)
    comp.keep_unsent("p", indices, values - sent)
    comp.commit()
    delivered = torch.zeros(5).index_add_(0, indices, sent)
    torch.testing.assert_close(delivered + comp.residuals["p"], grad, rtol=0, atol=1e-7)
    assert comp.residuals["p"][0] == pytest.approx(0.1)  # unsent entry: all of it stays
    assert float(comp.residuals["p"][indices].abs().max()) <= float(scale) / 2 + 1e-7  # nearest, with noise 0.5


def test_offsets_take_uint16_up_to_65536_entries_per_parameter():
    assert offset_dtype(65536) == torch.uint16
    assert offset_dtype(65537) == torch.int32


def test_offsets_map_to_bucket_positions_through_each_parameters_start():
    # Parameters of 3 and 5 entries, k = 1 and 2: offset 1 of the first, 0 and 4 of the second.
    offsets = torch.tensor([1, 0, 4], dtype=torch.uint16)
    assert bucket_indices(offsets, [1, 2], [3, 5]).tolist() == [1, 3, 7]


def test_an_offset_outside_its_parameter_names_the_rank_it_came_from():
    with pytest.raises(GatheredGarbage, match="rank 1's offsets outside their parameters.*5 in a parameter of 5"):
        bucket_indices(torch.tensor([1, 0, 5]), [1, 2], [3, 5], rank=1)
    with pytest.raises(GatheredGarbage, match="rank 0"):
        bucket_indices(torch.tensor([-1], dtype=torch.int32), [1], [3])
