"""The gate's config types validate on construction: a bad registry.toml [gate] table fails to load."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError
from pipeline.evaluation.config import GateConfig, Guardrail


@pytest.mark.parametrize(("change", "words"), [
    ({"review_rate": 0.0}, r"gate.review_rate .* must be in \(0, 1\)"),
    ({"review_rate": 1.0}, r"gate.review_rate .* must be in \(0, 1\)"),
    ({"budget_recall_margin": Guardrail(-0.01)}, "gate.budget_recall_margin are margins"),
])
def test_budget_settings_are_validated(change, words):
    with pytest.raises(ConfigError, match=words):
        GateConfig(**change)
