"""Learning rate as a pure function of the global optimizer step.

Linear warmup from 0 to the peak, then cosine decay to ``peak * min_lr_ratio`` at ``total_steps``.
Because the only state is the step, a resumed run continues the exact schedule.
"""

from __future__ import annotations

import math

from pipeline.training.config import ScheduleConfig


def lr_at_step(step: int, peak_lr: float, total_steps: int, config: ScheduleConfig) -> float:
    """Learning rate used for optimizer step ``step`` (0-based) of ``total_steps``."""
    warmup = min(config.warmup_steps, max(total_steps - 1, 0))
    if step < warmup:
        return peak_lr * (step + 1) / warmup
    decay_steps = max(total_steps - warmup, 1)
    progress = min(1.0, (step - warmup) / decay_steps)
    floor = peak_lr * config.min_lr_ratio
    return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
