"""DDP communication hooks: plain all-reduce, fp16/bf16 compression, top-k (with or without error
feedback). Each hook counts the bytes it hands to collectives, so ratios are measured.

Byte accounting (per rank and optimizer step): ``bytes_sent`` is the size of the tensors this rank
passes to the collective (all-reduce input, or its own all-gather contribution); ``bytes_dense`` is
what an fp32 all-reduce of the same buckets would pass. Under ``no_sync`` DDP calls no hook, so only
the synchronising micro-step counts. Every parameter is compressed and counted, however small: at
least one (value, index) pair each, so the ratio at low density is bounded by the number of tensors.

With ``local_clipping`` the top-k hook clips each rank's bucket before error feedback accumulates it,
and :attr:`CommState.clipped_locally` tells the trainer not to clip the averaged gradient again.
"""

# No ``from __future__ import annotations`` here: DDP checks the hooks' annotations at runtime
# (``bucket: dist.GradBucket``), and postponed annotations would be strings.
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from pipeline.training.compression import TopKCompressor, clip_norm_, densify, k_for, local_clip_threshold
from pipeline.training.config import CompressionConfig


class CompressionUnsupported(ValueError):
    """The configured compression cannot run on this backend."""


@dataclass
class CommState:
    """Hook state shared by DDP's hook calls within one process."""

    method: str
    world_size: int
    names: dict[int, str]  # id(parameter) -> qualified name
    compressor: TopKCompressor | None = None
    local_clip: float = 0.0  # bound on the averaged gradient's norm, enforced per rank on sparse steps; 0 = off
    model_numel: int = 0  # entries of all parameters (a bucket's share of local_clip follows from it)
    density: float = 1.0  # of the current step, set by begin_step
    dense: bool = True  # the current step all-reduces densely (warm-up)
    step_bytes_sent: int = 0
    step_bytes_dense: int = 0
    process_group: dist.ProcessGroup | None = field(default=None, repr=False)

    def begin_step(self, density: float, dense: bool) -> None:
        self.density, self.dense = density, dense
        self.step_bytes_sent = self.step_bytes_dense = 0

    @property
    def clipped_locally(self) -> bool:
        """This step's gradient was clipped per rank before compression: do not clip the average."""
        return self.local_clip > 0 and not self.dense

    def count(self, sent: int, dense: int) -> None:
        self.step_bytes_sent += sent
        self.step_bytes_dense += dense


def _dense_bytes(buffer: torch.Tensor) -> int:
    return buffer.numel() * 4  # fp32 all-reduce is the reference


def allreduce_hook(state: CommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    state.count(buffer.numel() * buffer.element_size(), _dense_bytes(buffer))
    buffer.div_(state.world_size)
    work = dist.all_reduce(buffer, group=state.process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def fp16_hook(state: CommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    state.count(buffer.numel() * 2, _dense_bytes(buffer))
    return default_hooks.fp16_compress_hook(state.process_group, bucket)


def bf16_hook(state: CommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    state.count(buffer.numel() * 2, _dense_bytes(buffer))
    return default_hooks.bf16_compress_hook(state.process_group, bucket)


def _param_views(bucket: dist.GradBucket) -> list[tuple[torch.nn.Parameter, torch.Tensor, int]]:
    """(parameter, its slice of the bucket buffer, offset of that slice) for every parameter in the bucket.

    DDP lays a bucket out as its parameters' gradients back to back, in ``parameters()`` order. The
    slices are taken from the buffer itself: right after a (re)start, before DDP rebuilds its buckets,
    ``bucket.gradients()`` need not live inside the buffer, so pointer arithmetic on them gave
    out-of-range indices on a resumed run.
    """
    buffer = bucket.buffer()
    views, offset = [], 0
    for p in bucket.parameters():
        views.append((p, buffer[offset:offset + p.numel()], offset))
        offset += p.numel()
    if offset != buffer.numel():
        raise RuntimeError(f"DDP bucket layout changed: parameters hold {offset} values, buffer {buffer.numel()}")
    return views


def topk_hook(state: CommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Top-k per parameter; every rank all-gathers the same number of (value, index) pairs."""
    compressor = state.compressor
    assert compressor is not None
    buffer = bucket.buffer()
    if buffer.dtype != torch.float32:
        raise CompressionUnsupported(f"top-k compression expects fp32 gradients, got {buffer.dtype}")
    if state.dense:  # warm-up step: residual (if any) goes out with the dense gradient
        for p, g, _ in _param_views(bucket):
            compressor.fold_residual(state.names[id(p)], g)
        return allreduce_hook(state, bucket)
    if state.clipped_locally:
        clip_norm_(buffer, local_clip_threshold(state.local_clip, state.world_size, buffer.numel() / state.model_numel))
    values, indices = [], []
    for p, g, offset in _param_views(bucket):
        v, i = compressor.compress(state.names[id(p)], g, k_for(g.numel(), state.density))
        values.append(v)
        indices.append(i + offset)
    # One collective per bucket: fp32 values bit-cast to int32, then int32 bucket offsets.
    k_total = sum(v.numel() for v in values)
    payload = torch.cat([torch.cat(values).view(torch.int32), torch.cat(indices).to(torch.int32)])
    state.count(payload.numel() * payload.element_size(), _dense_bytes(buffer))
    gathered = [torch.empty_like(payload) for _ in range(state.world_size)]
    work = dist.all_gather(gathered, payload, group=state.process_group, async_op=True)

    def decode(_: torch.futures.Future) -> torch.Tensor:
        # Read our own output list: on gloo the future's value layout differs from NCCL's.
        vals = [t[:k_total].view(torch.float32) for t in gathered]
        idxs = [t[k_total:].long() for t in gathered]
        return densify(vals, idxs, buffer.numel(), state.world_size, out=buffer)

    return work.get_future().then(decode)


HOOKS = {"allreduce": allreduce_hook, "fp16": fp16_hook, "bf16": bf16_hook, "topk_ef": topk_hook, "topk": topk_hook}


def register_compression(model: DistributedDataParallel, config: CompressionConfig, backend: str,
                         grad_clip: float = 0.0) -> CommState:
    """Install the hook of ``config.method`` on ``model``; returns its state (bytes, compressor).

    ``grad_clip`` is the optimizer's bound on the averaged gradient's norm (0 = none); with
    ``config.local_clipping`` it becomes each rank's bound on sparse steps (:func:`local_clip_threshold`).
    """
    if config.method == "bf16" and backend != "nccl":
        raise CompressionUnsupported(
            f"bf16 gradient compression needs the nccl backend (this run uses {backend}); "
            "set compression.method = \"fp16\" for CPU/gloo runs")
    state = CommState(
        method=config.method,
        world_size=dist.get_world_size(),
        names={id(p): name for name, p in model.module.named_parameters()},
        compressor=TopKCompressor(error_feedback=config.method == "topk_ef") if config.method.startswith("topk") else None,
        local_clip=grad_clip if config.local_clipping else 0.0,
        model_numel=sum(p.numel() for p in model.module.parameters() if p.requires_grad),
    )
    model.register_comm_hook(state, HOOKS[config.method])
    return state
