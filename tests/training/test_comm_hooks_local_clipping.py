"""Local clipping in the top-k hook, on 2 real gloo processes: each rank's gradient is clipped to
``grad_clip * sqrt(2)`` before error feedback accumulates it, and only on sparse steps."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from models.fraud_mlp import FraudModel
from pipeline.training.comm_hooks import register_compression
from pipeline.training.compression import densify, k_for, local_clip_threshold, select_topk
from pipeline.training.config import CompressionConfig
from tests.training.ddp_scenarios import MODEL, _batch, _loss
from tests.training.two_ranks import run_on_two_ranks

pytestmark = pytest.mark.slow

GRAD_CLIP, DENSITY = 0.01, 0.1  # a bound far below the gradient's norm, so clipping always acts


def _clipped_run(rank: int, dense: bool) -> tuple[DistributedDataParallel, object]:
    torch.manual_seed(0)
    ddp = DistributedDataParallel(FraudModel(MODEL))  # one bucket: the model is small
    config = CompressionConfig(method="topk_ef", density=DENSITY, local_clipping=True)
    state = register_compression(ddp, config, "gloo", grad_clip=GRAD_CLIP)
    state.begin_step(DENSITY, dense=dense)
    _loss(ddp, *_batch(rank, 0)).backward()
    return ddp, state


def clipped_sparse_step(rank: int) -> dict:
    torch.manual_seed(0)
    local = FraudModel(MODEL)
    _loss(local, *_batch(rank, 0)).backward()
    own = {name: p.grad.reshape(-1).clone() for name, p in local.named_parameters()}
    norm = float(torch.linalg.vector_norm(torch.cat(list(own.values()))))
    bound = local_clip_threshold(GRAD_CLIP, 2)
    clipped = {name: g * (bound / (norm + 1e-6)) for name, g in own.items()}

    ddp, state = _clipped_run(rank, dense=False)
    diffs, conservation, residual_sq = [], [], 0.0
    for name, p in ddp.module.named_parameters():
        every = [torch.empty_like(clipped[name]) for _ in range(2)]
        dist.all_gather(every, clipped[name])
        k = k_for(clipped[name].numel(), DENSITY)
        picks = [select_topk(g, k) for g in every]
        expected = densify([v for v, _ in picks], [i for _, i in picks], clipped[name].numel(), 2)
        diffs.append(float((p.grad.reshape(-1) - expected).abs().max()))
        residual = state.compressor.staged[name]
        mine_sent = torch.zeros_like(residual).index_add_(0, picks[rank][1], picks[rank][0])
        conservation.append(float((mine_sent + residual - clipped[name]).abs().max()))
        residual_sq += float(residual.pow(2).sum())

    dense_ddp, dense_state = _clipped_run(rank, dense=True)
    reference = {name: torch.empty_like(g) for name, g in own.items()}
    for name, g in own.items():
        reference[name] = g.clone()
        dist.all_reduce(reference[name])
        reference[name] /= 2
    dense_diff = max(float((p.grad.reshape(-1) - reference[n]).abs().max())
                     for n, p in dense_ddp.module.named_parameters())
    return {"local_norm": norm, "bound": bound, "max_diff": max(diffs), "conservation": max(conservation),
            "residual_norm": residual_sq ** 0.5, "clipped_locally": state.clipped_locally,
            "dense_clipped_locally": dense_state.clipped_locally, "dense_max_diff": dense_diff}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    return run_on_two_ranks([clipped_sparse_step], tmp_path_factory.mktemp("ddp-clip"))["clipped_sparse_step"]


def test_sparse_step_sends_topk_of_each_ranks_clipped_gradient(results):
    for r in results:
        assert r["local_norm"] > 10 * r["bound"]  # the scenario really clips
        assert r["clipped_locally"] is True
        assert r["max_diff"] < 1e-9  # the norm is summed in another order than here: rounding only
        assert r["conservation"] < 1e-9  # sent + residual == the clipped gradient
        assert r["residual_norm"] <= r["bound"] * (1 + 1e-5)


def test_dense_warmup_step_is_not_clipped_locally(results):
    for r in results:
        assert r["dense_clipped_locally"] is False
        assert r["dense_max_diff"] < 1e-6  # plain average: the trainer clips it as a whole
