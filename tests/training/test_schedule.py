from __future__ import annotations

import math

import pytest

from pipeline.training.config import ScheduleConfig
from pipeline.training.schedule import lr_at_step


def test_linear_warmup_then_cosine_to_floor():
    cfg = ScheduleConfig(warmup_steps=10, min_lr_ratio=0.1)
    peak, total = 1.0, 110
    assert lr_at_step(0, peak, total, cfg) == pytest.approx(0.1)
    assert lr_at_step(4, peak, total, cfg) == pytest.approx(0.5)
    assert lr_at_step(9, peak, total, cfg) == pytest.approx(1.0)
    assert lr_at_step(10, peak, total, cfg) == pytest.approx(1.0)  # cosine starts at the peak
    assert lr_at_step(60, peak, total, cfg) == pytest.approx(0.55)  # halfway: (peak + floor) / 2
    assert lr_at_step(85, peak, total, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.75)))
    assert lr_at_step(110, peak, total, cfg) == pytest.approx(0.1)
    assert lr_at_step(500, peak, total, cfg) == pytest.approx(0.1)


def test_decay_is_monotone_and_keyed_only_to_the_step():
    cfg = ScheduleConfig(warmup_steps=5, min_lr_ratio=0.0)
    lrs = [lr_at_step(s, 3e-3, 50, cfg) for s in range(5, 51)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))
    # Step 17 is 17 - 5 = 12 of the 50 - 5 = 45 decay steps; the floor is 0 (min_lr_ratio).
    assert lr_at_step(17, 3e-3, 50, cfg) == pytest.approx(3e-3 * 0.5 * (1 + math.cos(math.pi * 12 / 45)), rel=1e-12)
    assert lr_at_step(17, 3e-3, 50, cfg) > lr_at_step(18, 3e-3, 50, cfg)  # strictly decaying, not flat


def test_warmup_longer_than_the_run_still_reaches_the_peak():
    cfg = ScheduleConfig(warmup_steps=100, min_lr_ratio=0.0)
    assert lr_at_step(8, 1.0, 10, cfg) == pytest.approx(1.0)
