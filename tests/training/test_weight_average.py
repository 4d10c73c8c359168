"""The exponential moving average of the weights: ramp, update rule, swapping in and out."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline.training.weight_average import WeightAverage, decay_at_update


def test_decay_ramps_up_from_a_tenth_and_stops_at_the_configured_value():
    assert decay_at_update(0, 0.999) == pytest.approx(0.1)
    assert decay_at_update(90, 0.999) == pytest.approx(91 / 100)
    assert decay_at_update(100_000, 0.999) == 0.999
    assert decay_at_update(100_000, 0.5) == 0.5


def test_update_blends_the_current_parameters_into_the_average():
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(0.0)
    average = WeightAverage(model, decay=0.999)
    with torch.no_grad():
        model.weight.fill_(1.0)
    average.update(0)  # old average weighs 0.1
    assert average.shadow[0].flatten().tolist() == pytest.approx([0.9, 0.9])
    with torch.no_grad():
        model.weight.fill_(2.0)
    average.update(1)  # old average weighs 2/11
    assert average.shadow[0].flatten().tolist() == pytest.approx([0.9 * 2 / 11 + 2.0 * 9 / 11] * 2)


def test_applied_swaps_the_average_in_and_the_raw_weights_back_even_on_error():
    model = nn.Linear(2, 1)
    raw = [p.detach().clone() for p in model.parameters()]
    average = WeightAverage(model, decay=0.9)
    average.load([torch.full_like(p, 7.0) for p in model.parameters()])
    with average.applied():
        assert all(torch.all(p == 7.0) for p in model.parameters())
    assert all(torch.equal(p, r) for p, r in zip(model.parameters(), raw, strict=True))
    with pytest.raises(RuntimeError), average.applied():
        raise RuntimeError("validation failed")
    assert all(torch.equal(p, r) for p, r in zip(model.parameters(), raw, strict=True))
