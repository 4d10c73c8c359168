"""Which presets ``fraudctl bench decisions`` runs."""

from __future__ import annotations

import pytest

from pipeline.bench.dataset import PRESETS
from pipeline.bench.decisions import selected_presets


def test_the_presets_named_run_in_the_bench_order_and_all_run_when_none_is_named():
    assert selected_presets("highrisk, ecommerce") == ("ecommerce", "highrisk")
    assert selected_presets(None) == selected_presets("") == PRESETS


def test_an_unknown_preset_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown presets retail"):
        selected_presets("default,retail")
