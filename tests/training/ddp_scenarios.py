"""Two-rank DDP scenarios for test_comm_hooks, run in one spawn by :mod:`tests.training.two_ranks`.

Each scenario runs on both ranks (gloo, FileStore rendezvous: no port) and returns a dict of
measurements the tests assert on. The model, batches and loss here are shared by the other hook tests.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from models.fraud_mlp import FraudModel, FraudModelConfig
from pipeline.training.comm_hooks import register_compression
from pipeline.training.compression import densify, k_for, select_topk
from pipeline.training.config import CompressionConfig
from pipeline.training.distributed import ReplicaMismatch, check_replicas

MODEL = FraudModelConfig(("a", "b", "c", "d"), {"x": 7, "y": 5}, embedding_dim=3, hidden_dim=24, num_blocks=1,
                         dropout=0.0)
TINY_BUCKETS_MB = 0.002  # several buckets, so per-bucket offsets are exercised


def _batch(rank: int, step: int, rows: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(rows, 4, generator=gen)
    c = torch.randint(0, 5, (rows, 2), generator=gen)
    y = (torch.rand(rows, generator=gen) < 0.3).float()
    return x, c, y


def _loss(model, x, c, y) -> torch.Tensor:
    return torch.nn.functional.binary_cross_entropy_with_logits(model(x, c), y)


def _ddp(method: str | None, density: float = 1.0):
    torch.manual_seed(0)  # same initial weights on every rank and in every scenario
    ddp = DistributedDataParallel(FraudModel(MODEL), bucket_cap_mb=TINY_BUCKETS_MB)
    state = register_compression(ddp, CompressionConfig(method=method, density=density), "gloo") if method else None
    return ddp, state


def _grads_after_one_step(method: str | None, rank: int, density: float = 1.0, dense: bool = False):
    ddp, state = _ddp(method, density)
    if state:
        state.begin_step(density, dense)
    _loss(ddp, *_batch(rank, 0)).backward()
    return {n: p.grad.clone() for n, p in ddp.module.named_parameters()}, state


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def density_one_equals_dense(rank: int) -> dict:
    reference, _ = _grads_after_one_step(None, rank)  # DDP's built-in all-reduce
    out = {}
    for method in ("topk_ef", "topk"):
        grads, state = _grads_after_one_step(method, rank, density=1.0, dense=False)
        out[f"{method}_max_diff"] = _max_diff(grads, reference)
        out[f"{method}_bytes_sent"] = state.step_bytes_sent
    for method, dense in (("allreduce", True), ("topk_ef", True)):
        grads, state = _grads_after_one_step(method, rank, dense=dense)
        out[f"{method}_dense_max_diff"] = _max_diff(grads, reference)
        out[f"{method}_dense_bytes_sent"] = state.step_bytes_sent
    out["numel"] = sum(p.numel() for p in FraudModel(MODEL).parameters())
    return out


def sparse_matches_manual(rank: int) -> dict:
    density = 0.1
    grads, state = _grads_after_one_step("topk_ef", rank, density=density)
    torch.manual_seed(0)
    local = FraudModel(MODEL)  # the same model without DDP: this rank's own gradient
    _loss(local, *_batch(rank, 0)).backward()
    world = dist.get_world_size()
    diffs, expected_bytes = [], 0
    for name, p in local.named_parameters():
        flat = p.grad.reshape(-1).contiguous()
        every = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(every, flat)
        k = k_for(flat.numel(), density)
        expected_bytes += 8 * k
        picks = [select_topk(g, k) for g in every]
        expected = densify([v for v, _ in picks], [i for _, i in picks], flat.numel(), world)
        diffs.append(float((grads[name].reshape(-1) - expected).abs().max()))
    residual_total = sum(float(r.abs().sum()) for r in state.compressor.staged.values())
    return {"max_diff": max(diffs), "bytes_sent": state.step_bytes_sent, "expected_bytes": expected_bytes,
            "bytes_dense": state.step_bytes_dense, "dense_bytes_expected": 4 * sum(p.numel() for p in local.parameters()),
            "staged_residual_abs_sum": residual_total}


def replicas_stay_identical(rank: int) -> dict:
    ddp, state = _ddp("topk_ef", 0.05)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    initial = [p.detach().clone() for p in ddp.module.parameters()]
    for step in range(12):
        state.begin_step(0.05, dense=step < 2)
        opt.zero_grad()
        _loss(ddp, *_batch(rank, step)).backward()
        opt.step()
        state.compressor.commit()
    check_replicas(ddp.module, 12, torch.device("cpu"))  # raises if the bits differ
    params = torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])
    every = [torch.empty_like(params) for _ in range(dist.get_world_size())]
    dist.all_gather(every, params)
    residual = torch.cat([r.reshape(-1) for r in state.compressor.residuals.values()])
    residuals = [torch.empty_like(residual) for _ in range(dist.get_world_size())]
    dist.all_gather(residuals, residual)
    moved = max(float((p - q).abs().max()) for p, q in zip(ddp.module.parameters(), initial, strict=True))
    return {"bit_identical": all(torch.equal(every[0], e) for e in every), "moved": moved,
            "residuals_differ_across_ranks": not torch.equal(residuals[0], residuals[1]),
            "residual_names": sorted(state.compressor.residuals)}


def accumulation_matches_big_batch(rank: int) -> dict:
    x, c, y = _batch(rank, 5, rows=64)
    big, big_state = _ddp("allreduce")
    big_state.begin_step(1.0, dense=True)
    _loss(big, x, c, y).backward()
    acc, acc_state = _ddp("allreduce")
    acc_state.begin_step(1.0, dense=True)
    with acc.no_sync():
        (_loss(acc, x[:32], c[:32], y[:32]) / 2).backward()
    bytes_after_no_sync = acc_state.step_bytes_sent
    (_loss(acc, x[32:], c[32:], y[32:]) / 2).backward()
    diff = max(float((p.grad - q.grad).abs().max())
               for p, q in zip(big.module.parameters(), acc.module.parameters(), strict=True))
    return {"max_diff": diff, "bytes_after_no_sync": bytes_after_no_sync,
            "bytes_after_sync": acc_state.step_bytes_sent, "big_batch_bytes": big_state.step_bytes_sent}


def fp16_counts_half_the_bytes(rank: int) -> dict:
    grads, state = _grads_after_one_step("fp16", rank, dense=True)
    reference, _ = _grads_after_one_step(None, rank)
    return {"bytes_sent": state.step_bytes_sent, "bytes_dense": state.step_bytes_dense,
            "max_diff": _max_diff(grads, reference)}


def nan_on_one_rank_reaches_every_rank(rank: int) -> dict:
    ddp, state = _ddp("topk_ef", 0.01)
    state.begin_step(0.01, dense=False)
    loss = _loss(ddp, *_batch(rank, 0))
    (loss * math.nan if rank == 0 else loss).backward()
    nonfinite = any(not torch.isfinite(p.grad).all() for p in ddp.module.parameters())
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, nonfinite)
    state.compressor.discard()
    return {"nonfinite_on_every_rank": all(flags), "residuals_after_discard": len(state.compressor.residuals)}


def checksum_mismatch_detected(rank: int) -> dict:
    torch.manual_seed(0)
    model = FraudModel(MODEL)
    check_replicas(model, 1, torch.device("cpu"))  # equal: no error
    if rank == 1:
        with torch.no_grad():
            p = next(model.parameters())
            p.view(-1)[0] = torch.nextafter(p.view(-1)[0], torch.tensor(math.inf))
    try:
        check_replicas(model, 2, torch.device("cpu"))
    except ReplicaMismatch as exc:
        return {"error": str(exc)}
    return {"error": None}


SCENARIOS = [density_one_equals_dense, sparse_matches_manual, replicas_stay_identical,
             accumulation_matches_big_batch, fp16_counts_half_the_bytes,
             nan_on_one_rank_reaches_every_rank, checksum_mismatch_detected]
