"""JSON has no NaN: the one conversion of undefined figures to ``null`` for stored reports."""

from __future__ import annotations

import math
from typing import Any


def nan_to_none(value: Any) -> Any:
    """``value`` with every NaN float (in nested dicts, lists and tuples) replaced by None."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [nan_to_none(v) for v in value]
    return value
