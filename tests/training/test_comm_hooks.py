"""Communication hooks on 2 real gloo processes (one spawn runs every scenario of ddp_scenarios)."""

from __future__ import annotations

import pytest

from tests.training import ddp_scenarios
from tests.training.two_ranks import run_on_two_ranks

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    return run_on_two_ranks(ddp_scenarios.SCENARIOS, tmp_path_factory.mktemp("ddp"))


def test_density_one_gives_exactly_the_dense_allreduce(results):
    for rank_result in results["density_one_equals_dense"]:
        assert rank_result["topk_ef_max_diff"] == 0.0
        assert rank_result["topk_max_diff"] == 0.0
        assert rank_result["allreduce_dense_max_diff"] == 0.0
        assert rank_result["topk_ef_dense_max_diff"] == 0.0
        numel = rank_result["numel"]
        assert rank_result["allreduce_dense_bytes_sent"] == 4 * numel
        assert rank_result["topk_ef_bytes_sent"] == 8 * numel  # value + index for every entry


def test_sparse_exchange_sums_every_ranks_topk_and_counts_bytes(results):
    for r in results["sparse_matches_manual"]:
        assert r["max_diff"] == 0.0
        assert r["bytes_sent"] == r["expected_bytes"]
        assert r["bytes_dense"] == r["dense_bytes_expected"]
        assert r["bytes_dense"] / r["bytes_sent"] > 4  # 10% density, 8 bytes per sent entry
        assert r["staged_residual_abs_sum"] > 0


def test_replicas_stay_bit_identical_with_compression(results):
    for r in results["replicas_stay_identical"]:
        assert r["bit_identical"] is True
        assert r["moved"] > 1e-3
        assert r["residuals_differ_across_ranks"] is True  # residuals are local, parameters are not
        assert "input.weight" in r["residual_names"]  # keyed by parameter name


def test_no_sync_accumulation_matches_a_big_batch_step(results):
    for r in results["accumulation_matches_big_batch"]:
        # Summation order differs (two halves vs one mean), so equal to float32 rounding, not bitwise.
        assert r["max_diff"] < 1e-6
        assert r["bytes_after_no_sync"] == 0  # no hook call under no_sync
        assert r["bytes_after_sync"] == r["big_batch_bytes"]


def test_fp16_sends_half_the_bytes(results):
    for r in results["fp16_counts_half_the_bytes"]:
        assert r["bytes_sent"] * 2 == r["bytes_dense"]
        assert 0 < r["max_diff"] < 1e-3


def test_a_nan_gradient_on_one_rank_is_seen_by_all(results):
    for r in results["nan_on_one_rank_reaches_every_rank"]:
        assert r["nonfinite_on_every_rank"] is True
        assert r["residuals_after_discard"] == 0


def test_a_parameter_checksum_mismatch_stops_every_rank(results):
    for r in results["checksum_mismatch_detected"]:
        assert r["error"] is not None and "ranks [1]" in r["error"]
