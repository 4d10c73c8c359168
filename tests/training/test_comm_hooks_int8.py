"""The int8, top-k int8 and peer (bf16, PowerSGD) hooks on 2 real gloo processes, one spawn for all.

Each scenario recomputes on every rank what the rank should have sent, with the pure functions of
pipeline/training/compression.py, gathers those payloads (dequantized, fp32) and compares what DDP
delivered with their rank-order sum; byte counts are checked against their formulas.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from models.fraud_mlp import FraudModel
from pipeline.training.comm_hooks import register_compression
from pipeline.training.compression import (
    chunk_ids,
    chunk_scales,
    densify,
    dequantize_int8,
    k_for,
    quantize_int8,
    rounding_noise,
    select_topk,
)
from pipeline.training.config import CompressionConfig
from pipeline.training.distributed import check_replicas
from tests.training.ddp_scenarios import MODEL, TINY_BUCKETS_MB, _batch, _loss
from tests.training.two_ranks import run_on_two_ranks

pytestmark = pytest.mark.slow

CHUNK, DENSITY, SEED = 16, 0.1, 5


def _ddp(config: CompressionConfig, bucket_cap_mb: float = 25.0, model: torch.nn.Module | None = None):
    torch.manual_seed(0)
    ddp = DistributedDataParallel(model or FraudModel(MODEL), bucket_cap_mb=bucket_cap_mb)
    return ddp, register_compression(ddp, config, "gloo", seed=SEED)


def _own_gradients(rank: int) -> dict[str, torch.Tensor]:
    """This rank's flat local gradients (the same model without DDP)."""
    torch.manual_seed(0)
    local = FraudModel(MODEL)
    _loss(local, *_batch(rank, 0)).backward()
    return {name: p.grad.reshape(-1).clone() for name, p in local.named_parameters()}


def _gather(t: torch.Tensor) -> list[torch.Tensor]:
    every = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(every, t.contiguous())
    return every


def _max_diff(ddp: DistributedDataParallel, expected: dict[str, torch.Tensor]) -> float:
    return max(float((p.grad.reshape(-1) - expected[n]).abs().max()) for n, p in ddp.module.named_parameters())


def _int8_payload(name: str, acc: torch.Tensor, rank: int, step: int) -> torch.Tensor:
    chunks = chunk_ids([acc.numel()], CHUNK)
    scale = chunk_scales(acc, chunks, int(chunks[-1]) + 1)[chunks]
    return dequantize_int8(quantize_int8(acc, scale, rounding_noise([(name, acc.numel())], SEED, rank, step)), scale)


def int8_sum_is_exact(rank: int) -> dict:
    """int8_ef, several buckets: the delivered gradient is the rank-order mean of the dequantized payloads."""
    config = CompressionConfig(method="int8_ef", quantization_chunk=CHUNK)
    ddp, state = _ddp(config, TINY_BUCKETS_MB)
    state.begin_step(1.0, dense=False)
    _loss(ddp, *_batch(rank, 0)).backward()  # DDP starts with one bucket and rebuilds after this step
    ddp.zero_grad(set_to_none=True)
    state.discard()
    state.begin_step(1.0, dense=False, step=3)
    _loss(ddp, *_batch(rank, 0)).backward()
    state.end_backward()
    own = _own_gradients(rank)
    expected, residual_diff = {}, 0.0
    for name, g in own.items():
        mine = _int8_payload(name, g, rank, 3)
        every = _gather(mine)
        expected[name] = (torch.zeros_like(g) + every[0] + every[1]) / 2  # rank order, as the hook adds
        residual_diff = max(residual_diff, float((state.compressor.staged[name] - (g - mine)).abs().max()))
    numel = sum(g.numel() for g in own.values())
    scales = sum(math.ceil(g.numel() / CHUNK) for g in own.values())
    return {"max_diff": _max_diff(ddp, expected), "residual_diff": residual_diff,
            "bytes_sent": state.step_bytes_sent, "expected_bytes": numel + 4 * scales,
            "bytes_dense": state.step_bytes_dense, "numel": numel, "buckets": state.step_buckets,
            "wait_s": state.step_wait_s, "hook_s": state.step_hook_s}


def _topk_int8_expected(own: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    picks = {name: select_topk(g, k_for(g.numel(), DENSITY)) for name, g in own.items()}
    values = torch.cat([v for v, _ in picks.values()])
    scale = chunk_scales(values, torch.zeros_like(values, dtype=torch.long), 1)  # one scale per bucket
    expected = {}
    for name, (v, i) in picks.items():
        sent = dequantize_int8(quantize_int8(v, scale, rounding_noise([(name, v.numel())], SEED, rank, 0)), scale)
        expected[name] = densify(_gather(sent), _gather(i), own[name].numel(), dist.get_world_size())
    return expected


def topk_int8_sum_and_bytes(rank: int) -> dict:
    """topk_int8_ef at density 0.1 on one bucket: delivered = densify of the dequantized picks; bytes =
    one scale + k values of 1 byte + k uint16 offsets."""
    ddp, state = _ddp(CompressionConfig(method="topk_int8_ef", density=DENSITY))
    state.begin_step(DENSITY, dense=False)
    _loss(ddp, *_batch(rank, 0)).backward()
    own = _own_gradients(rank)
    k = sum(k_for(g.numel(), DENSITY) for g in own.values())
    return {"max_diff": _max_diff(ddp, _topk_int8_expected(own, rank)), "bytes_sent": state.step_bytes_sent,
            "expected_bytes": 4 + k * (1 + 2), "buckets": state.step_buckets}


def topk_int8_wide_offsets(rank: int) -> dict:
    """A parameter of more than 65536 entries: offsets travel as int32."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(300, 300), torch.nn.Linear(300, 1))
    ddp, state = _ddp(CompressionConfig(method="topk_int8_ef", density=0.01), model=model)
    state.begin_step(0.01, dense=False)
    x = torch.randn(8, 300, generator=torch.Generator().manual_seed(rank))
    ddp(x).pow(2).mean().backward()
    k = sum(k_for(p.numel(), 0.01) for p in model.parameters())
    finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    return {"bytes_sent": state.step_bytes_sent, "expected_bytes": 4 + k * (1 + 4), "finite": finite}


def topk_int8_warmup_in_int8(rank: int) -> dict:
    """A dense warm-up step of topk_int8_ef with dense_warmup_exchange = "int8" is the int8 exchange."""
    config = CompressionConfig(method="topk_int8_ef", dense_warmup_exchange="int8", quantization_chunk=CHUNK)
    ddp, state = _ddp(config)
    state.begin_step(1.0, dense=True)
    _loss(ddp, *_batch(rank, 0)).backward()
    own = _own_gradients(rank)
    expected = {}
    for name, g in own.items():
        every = _gather(_int8_payload(name, g, rank, 0))
        expected[name] = (torch.zeros_like(g) + every[0] + every[1]) / 2
    scales = sum(math.ceil(g.numel() / CHUNK) for g in own.values())
    return {"max_diff": _max_diff(ddp, expected), "bytes_sent": state.step_bytes_sent,
            "expected_bytes": sum(g.numel() for g in own.values()) + 4 * scales}


def replicas_stay_identical(rank: int) -> dict:
    """Twelve AdamW steps of each new method: replicas bit-identical, residuals local."""
    out = {}
    for method in ("int8_ef", "topk_int8_ef"):
        ddp, state = _ddp(CompressionConfig(method=method, density=0.05), TINY_BUCKETS_MB)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        for step in range(12):
            state.begin_step(0.05, dense=step < 2, step=step)
            opt.zero_grad()
            _loss(ddp, *_batch(rank, step)).backward()
            opt.step()
            state.commit()
        check_replicas(ddp.module, 12, torch.device("cpu"))  # raises if the bits differ
        residual = torch.cat([r.reshape(-1) for r in state.compressor.residuals.values()])
        out[method] = {"residuals_differ": not torch.equal(*_gather(residual)),
                       "residual_names": len(state.compressor.residuals)}
    return out


def nan_on_one_rank_reaches_every_rank(rank: int) -> dict:
    out = {}
    for method in ("int8_ef", "topk_int8_ef"):
        ddp, state = _ddp(CompressionConfig(method=method, density=0.05))
        state.begin_step(0.05, dense=False)
        loss = _loss(ddp, *_batch(rank, 0))
        (loss * math.nan if rank == 0 else loss).backward()
        nonfinite = any(not torch.isfinite(p.grad).all() for p in ddp.module.parameters())
        state.discard()
        flags = _gather(torch.tensor([int(nonfinite)]))
        out[method] = {"nonfinite_everywhere": all(bool(f) for f in flags), "residuals": len(state.compressor.residuals)}
    return out


def _powersgd_numel(model: torch.nn.Module, rank: int) -> int:
    """Entries torch's PowerSGD all-reduces per step: P and Q of each matrix worth compressing, the
    rest whole (its rule: (n + m) * r * 2 < n * m, with min_compression_rate 2)."""
    total = 0
    for p in model.parameters():
        n, m = p.shape[0], p.numel() // p.shape[0]
        r = min(n, m, rank)
        total += (n + m) * r if (n + m) * r * 2 < n * m else n * m
    return total


def powersgd_counts_p_q_and_uncompressed(rank: int) -> dict:
    out = {}
    for approx_rank in (1, 2):
        ddp, state = _ddp(CompressionConfig(method="powersgd", powersgd_rank=approx_rank))
        sent, diffs = [], []
        for step in range(4):
            state.begin_step(1.0, dense=step < 1, step=step)
            _loss(ddp, *_batch(rank, step)).backward()
            sent.append(state.step_bytes_sent)
            grads = torch.cat([p.grad.reshape(-1) for p in ddp.module.parameters()])
            diffs.append(max(float((grads - g).abs().max()) for g in _gather(grads)))
            state.commit()
        out[f"r{approx_rank}"] = {"sent": sent, "dense": state.step_bytes_dense, "replica_diff": max(diffs),
                                  "expected": 4 * _powersgd_numel(ddp.module, approx_rank)}
    return out


def bf16_runs_on_gloo(rank: int) -> dict:
    ddp, state = _ddp(CompressionConfig(method="bf16"))
    state.begin_step(1.0, dense=True)
    _loss(ddp, *_batch(rank, 0)).backward()
    own = _own_gradients(rank)
    expected = {n: sum(_gather(g)) / 2 for n, g in own.items()}
    return {"bytes_sent": state.step_bytes_sent, "bytes_dense": state.step_bytes_dense,
            "max_diff": _max_diff(ddp, expected)}


SCENARIOS = [int8_sum_is_exact, topk_int8_sum_and_bytes, topk_int8_wide_offsets, topk_int8_warmup_in_int8,
             replicas_stay_identical, nan_on_one_rank_reaches_every_rank, powersgd_counts_p_q_and_uncompressed,
             bf16_runs_on_gloo]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    return run_on_two_ranks(SCENARIOS, tmp_path_factory.mktemp("ddp-int8"))


def test_int8_all_gather_sum_equals_the_sum_of_the_dequantized_payloads(results):
    for r in results["int8_sum_is_exact"]:
        assert r["max_diff"] == 0.0  # bitwise: the same payloads added in the same order
        assert r["residual_diff"] == 0.0  # error feedback keeps acc - what was sent
        assert r["buckets"] > 1  # tiny buckets: chunks and offsets span several
        assert r["bytes_sent"] == r["expected_bytes"]  # one byte per entry + 4 per chunk's scale
        assert r["bytes_dense"] == 4 * r["numel"]
        assert r["wait_s"] >= 0 and r["hook_s"] > 0


def test_topk_int8_delivers_the_dequantized_picks_and_counts_its_compact_payload(results):
    for r in results["topk_int8_sum_and_bytes"]:
        assert r["buckets"] == 1
        assert r["max_diff"] == 0.0
        assert r["bytes_sent"] == r["expected_bytes"]  # 4 + k * (1 value byte + 2 offset bytes)


def test_topk_int8_offsets_widen_to_int32_past_65536_entries(results):
    for r in results["topk_int8_wide_offsets"]:
        assert r["finite"] is True
        assert r["bytes_sent"] == r["expected_bytes"]


def test_topk_int8_warmup_can_travel_as_int8(results):
    for r in results["topk_int8_warmup_in_int8"]:
        assert r["max_diff"] == 0.0
        assert r["bytes_sent"] == r["expected_bytes"]


def test_replicas_stay_bit_identical_with_int8_and_topk_int8(results):
    for r in results["replicas_stay_identical"]:
        for method in ("int8_ef", "topk_int8_ef"):
            assert r[method]["residuals_differ"] is True and r[method]["residual_names"] > 0


def test_a_nan_gradient_on_one_rank_reaches_every_rank_and_stages_nothing(results):
    for r in results["nan_on_one_rank_reaches_every_rank"]:
        for method in ("int8_ef", "topk_int8_ef"):
            assert r[method] == {"nonfinite_everywhere": True, "residuals": 0}


def test_powersgd_counts_p_q_and_the_uncompressed_tensors(results):
    for r in results["powersgd_counts_p_q_and_uncompressed"]:
        for approx_rank in ("r1", "r2"):
            run = r[approx_rank]
            # Dense warm-up, then torch's own first step (before the bucket rebuild) all-reduce densely.
            assert run["sent"][:2] == [run["dense"], run["dense"]]
            assert run["sent"][2:] == [run["expected"], run["expected"]]
            assert run["expected"] < run["dense"]
            assert run["replica_diff"] == 0.0  # every rank decompresses the same P and Q
        assert r["r1"]["expected"] < r["r2"]["expected"]


def test_bf16_runs_on_gloo_at_half_the_bytes(results):
    for r in results["bf16_runs_on_gloo"]:
        assert r["bytes_sent"] * 2 == r["bytes_dense"]
        assert 0 < r["max_diff"] < 1e-2
