"""DDP communication hooks: plain all-reduce; torch's fp16, bf16 and PowerSGD hooks (measured peers);
int8 quantization; top-k with fp32 or int8 values (with or without error feedback). Each hook counts
the bytes it hands to collectives, so ratios are measured.

Byte accounting (per rank and optimizer step): ``bytes_sent`` is the size of the tensors this rank
passes to the collective (all-reduce input, or its own all-gather contribution); ``bytes_dense`` is
what an fp32 all-reduce of the same buckets would pass. Under ``no_sync`` DDP calls no hook, so only
the synchronising micro-step counts. Every parameter is compressed and counted, however small: at
least one (value, index) pair each, so the ratio at low density is bounded by the number of tensors.
Per bucket: int8 sends one byte per entry plus an fp32 scale per chunk; top-k int8 one byte per value,
2 or 4 per offset and one fp32 scale; PowerSGD the entries it all-reduces (its P and Q matrices and the
tensors it leaves uncompressed: torch's own count, ``PowerSGDState.total_numel_after_compression``).

The int8 hooks all-gather every rank's int8 payload and scales (an int8 all-reduce could overflow)
and add the dequantized payloads in rank order: the sum is exact in the dequantized domain and every
replica computes the same bits.

Warm-ups: during the dense warm-up the top-k hooks send the residual out with the dense gradient,
all-reduced in fp32 or, with ``dense_warmup_exchange = "int8"``, int8-quantized with the method's
error feedback; PowerSGD runs a plain all-reduce (also for its first 2 steps after any start: DDP
rebuilds its buckets after the first, and torch's PowerSGD needs them settled). Its error feedback
and warm-start memories are not checkpointed: a resumed run starts them afresh. fp16, bf16 and
int8 compress every step.

Timing: DDP calls :func:`compression_hook`, which times the method's hook (encoding, launching the
collective) and notes when the last bucket was launched; :meth:`CommState.end_backward` then takes
the rest of backward as the wait for communication that backward's compute did not hide
(``comm_wait_s``, ``comm_wait_share``), on the clock that can see that wait (``comm_wait_clock``):

* ``host`` (gloo, CPU tensors): gloo's collectives finish on the host and DDP's ``backward()`` returns
  only once every bucket's future has, so host time from the last launch to its return is the wait.
* ``cuda_events`` (NCCL): ``backward()`` returns as soon as the compute stream has been told to wait
  for NCCL's stream; the wait happens on the GPU after the host has moved on, where a host clock
  reads about 0. An event recorded on the current stream at the last launch and another after
  ``backward()`` returns time it on the device; :class:`CommTiming` reads them when it writes the
  epoch's record (one synchronisation per epoch, none per step).

With ``local_clipping`` the top-k hooks clip each rank's bucket before error feedback accumulates it,
and :attr:`CommState.clipped_locally` tells the trainer not to clip the averaged gradient again.
"""

# No ``from __future__ import annotations`` here: DDP checks the hooks' annotations at runtime
# (``bucket: dist.GradBucket``), and postponed annotations would be strings.
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from pipeline.training.compression import (
    ErrorFeedback,
    TopKCompressor,
    bucket_indices,
    chunk_ids,
    chunk_scales,
    clip_norm_,
    densify,
    dequantize_int8,
    k_for,
    local_clip_threshold,
    offset_dtype,
    quantize_int8,
    rounding_noise,
)
from pipeline.training.config import CompressionConfig

POWERSGD_FIRST_STEP = 2  # torch's minimum with error feedback or warm start: after DDP's bucket rebuild


class CompressionUnsupported(ValueError):
    """The configured compression cannot run on these gradients."""


@dataclass
class CommState:
    """Hook state shared by DDP's hook calls within one process."""

    method: str
    world_size: int
    names: dict[int, str]  # id(parameter) -> qualified name
    compressor: ErrorFeedback | None = None  # residuals: a TopKCompressor for the top-k methods
    local_clip: float = 0.0  # bound on the averaged gradient's norm, enforced per rank on sparse steps; 0 = off
    model_numel: int = 0  # entries of all parameters (a bucket's share of local_clip follows from it)
    rank: int = 0
    seed: int = 0  # with rank and step, seeds the int8 rounding noise
    chunk_size: int = 256  # int8: entries sharing one scale
    dense_warmup_exchange: str = "allreduce"  # top-k methods' warm-up steps: "allreduce" or "int8"
    powersgd: powerSGD_hook.PowerSGDState | None = field(default=None, repr=False)
    step: int = 0  # global optimizer step, set by begin_step
    density: float = 1.0  # of the current step, set by begin_step
    dense: bool = True  # the current step all-reduces densely (warm-up)
    step_bytes_sent: int = 0
    step_bytes_dense: int = 0
    step_hook_s: float = 0.0  # time inside the hooks: encoding and launching collectives
    step_wait_s: float = 0.0  # backward's time after the last bucket's launch: exposed communication
    step_buckets: int = 0  # hook calls this step
    process_group: dist.ProcessGroup | None = field(default=None, repr=False)
    cuda_events: bool = False  # time the wait on the device (NCCL), not on the host: module docstring
    step_device_waits: list["DeviceWait"] = field(default_factory=list, repr=False)  # cuda_events: this step's
    _last_launch: float | None = field(default=None, repr=False)
    _last_launch_event: "torch.cuda.Event | None" = field(default=None, repr=False)

    def begin_step(self, density: float, dense: bool, step: int = 0) -> None:
        """Start optimizer ``step`` (it seeds the int8 rounding): its top-k density, whether it is a
        dense warm-up step; the per-step bytes and timings start from 0."""
        self.density, self.dense, self.step = density, dense, step
        self.step_bytes_sent = self.step_bytes_dense = self.step_buckets = 0
        self.step_hook_s = self.step_wait_s = 0.0
        self.step_device_waits = []
        self._last_launch = self._last_launch_event = None

    @property
    def clipped_locally(self) -> bool:
        """This step's gradient was clipped per rank before compression: do not clip the average."""
        return self.local_clip > 0 and not self.dense

    def count(self, sent: int, dense: int) -> None:
        self.step_bytes_sent += sent
        self.step_bytes_dense += dense

    def launched(self, started: float, returned: float) -> None:
        """A hook ran from ``started`` to ``returned`` (``time.perf_counter``) and left its collective running."""
        self.step_hook_s += returned - started
        self.step_buckets += 1
        self._last_launch = returned
        if self.cuda_events:  # after the hook's kernels and launch, on the stream backward runs on
            self._last_launch_event = torch.cuda.Event(enable_timing=True)
            self._last_launch_event.record()

    def end_backward(self) -> None:
        """Call right after the synchronising ``backward()`` returns (DDP has waited for every bucket):
        the time since the last bucket's launch is added to :attr:`step_wait_s` (host clock) or kept as
        a :class:`DeviceWait` in :attr:`step_device_waits` (CUDA events, read later)."""
        if self.cuda_events and self._last_launch_event is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.step_device_waits.append(DeviceWait(self._last_launch_event, end))
        elif self._last_launch is not None:
            self.step_wait_s += time.perf_counter() - self._last_launch
        self._last_launch = self._last_launch_event = None

    def commit(self) -> None:
        """The step was applied: staged residuals become the state."""
        if self.compressor is not None:
            self.compressor.commit()

    def discard(self) -> None:
        """The step was skipped (non-finite): keep the residuals as they were."""
        if self.compressor is not None:
            self.compressor.discard()
        if self.powersgd is not None:  # its error and warm-start memories took the non-finite values in
            for memory in (self.powersgd.error_dict, self.powersgd.p_memory_dict, self.powersgd.q_memory_dict):
                memory.clear()


@dataclass(frozen=True)
class DeviceWait:
    """One step's exposed communication on the GPU: events at the last launch and after ``backward()``."""

    start: "torch.cuda.Event"
    end: "torch.cuda.Event"

    def seconds(self) -> float:
        self.end.synchronize()  # the device has got past the wait
        return self.start.elapsed_time(self.end) / 1000


@dataclass
class CommTiming:
    """Step and communication times summed over steps (the trainer keeps one per epoch, for its record)."""

    steps: int = 0
    step_s: float = 0.0
    wait_s: float = 0.0
    hook_s: float = 0.0
    buckets: int = 0
    clock: str = "host"  # where the waits were timed: "host" or "cuda_events" (module docstring)
    device_waits: list[DeviceWait] = field(default_factory=list, repr=False)  # read at record()

    def add(self, step_s: float, comm: CommState) -> None:
        self.steps += 1
        self.step_s += step_s
        self.wait_s += comm.step_wait_s
        self.device_waits += comm.step_device_waits
        self.clock = "cuda_events" if comm.cuda_events else "host"
        self.hook_s += comm.step_hook_s
        self.buckets += comm.step_buckets

    def record(self, bucket_cap_mb: float) -> dict[str, float | str]:
        """Fields of an epoch record: totals, the share of step time spent waiting on communication
        (and the clock that timed it), and the DDP buckets exchanged per step (with the cap they were
        cut at). Reads the device waits kept so far: one synchronisation with the GPU."""
        self.wait_s += sum(w.seconds() for w in self.device_waits)
        self.device_waits = []
        return {"step_s": self.step_s, "comm_wait_s": self.wait_s, "comm_hook_s": self.hook_s,
                "comm_wait_share": self.wait_s / self.step_s if self.step_s > 0 else 0.0,
                "comm_wait_clock": self.clock,
                "buckets_per_step": self.buckets / self.steps if self.steps else 0.0,
                "bucket_cap_mb": bucket_cap_mb}


def _dense_bytes(buffer: torch.Tensor) -> int:
    return buffer.numel() * 4  # fp32 all-reduce is the reference


def _fp32_buffer(bucket: dist.GradBucket, what: str) -> torch.Tensor:
    buffer = bucket.buffer()
    if buffer.dtype != torch.float32:
        raise CompressionUnsupported(f"{what} expects fp32 gradients, got {buffer.dtype}")
    return buffer


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.int8)


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


def powersgd_hook(state: CommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's PowerSGD after the warm-ups, a plain all-reduce before (see the module docstring)."""
    psgd = state.powersgd
    assert psgd is not None
    if state.dense or psgd.iter < psgd.start_powerSGD_iter:
        psgd.maybe_increase_iter(bucket)
        return allreduce_hook(state, bucket)
    buffer = bucket.buffer()
    before = psgd.total_numel_after_compression
    future = powerSGD_hook.powerSGD_hook(psgd, bucket)
    state.count((psgd.total_numel_after_compression - before) * buffer.element_size(), _dense_bytes(buffer))
    return future


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


def int8_hook(state: CommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Each parameter's accumulated gradient as int8 with an fp32 scale per chunk (stochastic rounding);
    every rank all-gathers every payload and adds the dequantized ones (module docstring)."""
    feedback = state.compressor
    assert feedback is not None
    buffer = _fp32_buffer(bucket, "int8 quantization")
    views = _param_views(bucket)
    names = [state.names[id(p)] for p, _, _ in views]
    numels = [g.numel() for _, g, _ in views]
    acc = torch.cat([feedback.accumulate(name, g) for name, (_, g, _) in zip(names, views, strict=True)])
    chunks = chunk_ids(numels, state.chunk_size).to(buffer.device)
    scales = chunk_scales(acc, chunks, int(chunks[-1]) + 1)
    noise = rounding_noise(list(zip(names, numels, strict=True)), state.seed, state.rank, state.step, buffer.device)
    quantized = quantize_int8(acc, scales[chunks], noise)
    if feedback.error_feedback:
        lost = acc - dequantize_int8(quantized, scales[chunks])
        for name, residual in zip(names, lost.split(numels), strict=True):
            feedback.stage(name, residual)
    # Scales first: their fp32 view then starts at byte 0 of every gathered tensor (aligned).
    payload = torch.cat([_as_bytes(scales), quantized])
    state.count(payload.numel(), _dense_bytes(buffer))
    gathered = [torch.empty_like(payload) for _ in range(state.world_size)]
    work = dist.all_gather(gathered, payload, group=state.process_group, async_op=True)
    scale_bytes = 4 * scales.numel()

    def decode(_: torch.futures.Future) -> torch.Tensor:
        total = torch.zeros_like(buffer)
        for t in gathered:  # rank order, the same on every replica
            total += dequantize_int8(t[scale_bytes:], t[:scale_bytes].view(torch.float32)[chunks])
        return buffer.copy_(total.div_(state.world_size))

    return work.get_future().then(decode)


def _dense_warmup_hook(state: CommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A top-k method's warm-up step: the residual (if any) goes out with the dense gradient."""
    if state.dense_warmup_exchange == "int8":
        return int8_hook(state, bucket)
    for p, g, _ in _param_views(bucket):
        state.compressor.fold_residual(state.names[id(p)], g)
    return allreduce_hook(state, bucket)


def _clip_locally(state: CommState, buffer: torch.Tensor) -> None:
    if state.clipped_locally:
        clip_norm_(buffer, local_clip_threshold(state.local_clip, state.world_size, buffer.numel() / state.model_numel))


def _topk_method(sparse_step):
    """A top-k method's hook: the dense warm-up exchange on warm-up steps; otherwise the bucket
    (fp32, clipped per rank with ``local_clipping``) goes to ``sparse_step(state, bucket, buffer,
    compressor)``."""
    def hook(state: CommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        compressor = state.compressor
        assert isinstance(compressor, TopKCompressor)
        buffer = _fp32_buffer(bucket, "top-k compression")
        if state.dense:
            return _dense_warmup_hook(state, bucket)
        _clip_locally(state, buffer)
        return sparse_step(state, bucket, buffer, compressor)

    hook.__doc__ = sparse_step.__doc__
    return hook


def _topk_fp32(state: CommState, bucket: dist.GradBucket, buffer: torch.Tensor,
               compressor: TopKCompressor) -> torch.futures.Future[torch.Tensor]:
    """Top-k per parameter; every rank all-gathers the same number of (value, index) pairs."""
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


def _topk_int8(state: CommState, bucket: dist.GradBucket, buffer: torch.Tensor,
               compressor: TopKCompressor) -> torch.futures.Future[torch.Tensor]:
    """Top-k per parameter sent as int8 values with one fp32 scale per bucket and offsets within each
    parameter (uint16 or int32); the quantization error stays in the residual."""
    views = _param_views(bucket)
    names = [state.names[id(p)] for p, _, _ in views]
    numels = [g.numel() for _, g, _ in views]
    picks = [compressor.compress(name, g, k_for(g.numel(), state.density))
             for name, (_, g, _) in zip(names, views, strict=True)]
    ks = [v.numel() for v, _ in picks]
    values = torch.cat([v for v, _ in picks])
    scale = chunk_scales(values, torch.zeros_like(values, dtype=torch.long), 1)
    noise = rounding_noise(list(zip(names, ks, strict=True)), state.seed, state.rank, state.step, buffer.device)
    quantized = quantize_int8(values, scale, noise)
    lost = values - dequantize_int8(quantized, scale)
    for name, (_, i), part in zip(names, picks, lost.split(ks), strict=True):
        compressor.keep_unsent(name, i, part)
    dtype = offset_dtype(max(numels))
    offsets = torch.cat([i for _, i in picks]).to(dtype)
    # Widest first, so every view below starts aligned: scale (4 bytes), offsets (2 or 4), values (1).
    payload = torch.cat([_as_bytes(scale), _as_bytes(offsets), quantized])
    state.count(payload.numel(), _dense_bytes(buffer))
    gathered = [torch.empty_like(payload) for _ in range(state.world_size)]
    work = dist.all_gather(gathered, payload, group=state.process_group, async_op=True)
    values_at = 4 + offsets.numel() * offsets.element_size()

    def decode(_: torch.futures.Future) -> torch.Tensor:
        vals = [dequantize_int8(t[values_at:], t[:4].view(torch.float32)) for t in gathered]
        idxs = [bucket_indices(t[4:values_at].view(dtype), ks, numels, rank) for rank, t in enumerate(gathered)]
        return densify(vals, idxs, buffer.numel(), state.world_size, out=buffer)

    return work.get_future().then(decode)


topk_hook = _topk_method(_topk_fp32)
topk_int8_hook = _topk_method(_topk_int8)

HOOKS = {"allreduce": allreduce_hook, "fp16": fp16_hook, "bf16": bf16_hook, "int8": int8_hook, "int8_ef": int8_hook,
         "topk_ef": topk_hook, "topk": topk_hook, "topk_int8_ef": topk_int8_hook, "powersgd": powersgd_hook}
ERROR_FEEDBACK = ("int8_ef", "topk_ef", "topk_int8_ef")


def compression_hook(state: CommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """What DDP calls for every bucket: the hook of ``state.method``, timed (:meth:`CommState.launched`)."""
    started = time.perf_counter()
    future = HOOKS[state.method](state, bucket)
    state.launched(started, time.perf_counter())
    return future


def _residual_store(method: str) -> ErrorFeedback | None:
    if method.startswith("topk"):
        return TopKCompressor(error_feedback=method in ERROR_FEEDBACK)
    if method.startswith("int8"):
        return ErrorFeedback(error_feedback=method in ERROR_FEEDBACK)
    return None


def register_compression(model: DistributedDataParallel, config: CompressionConfig, backend: str,
                         grad_clip: float = 0.0, seed: int = 0) -> CommState:
    """Install the hook of ``config.method`` on ``model``; returns its state (bytes, timings, residuals).

    ``grad_clip`` is the optimizer's bound on the averaged gradient's norm (0 = none); with
    ``config.local_clipping`` it becomes each rank's bound on sparse steps (:func:`local_clip_threshold`).
    ``seed`` (the run's) seeds the int8 rounding noise and PowerSGD's random start. Every method runs
    on every ``backend`` (bf16 was refused on gloo until gloo reduced bf16, as it does in torch 2.13).
    """
    state = CommState(
        method=config.method,
        world_size=dist.get_world_size(),
        names={id(p): name for name, p in model.module.named_parameters()},
        compressor=_residual_store(config.method),
        local_clip=grad_clip if config.local_clipping else 0.0,
        model_numel=sum(p.numel() for p in model.module.parameters() if p.requires_grad),
        rank=dist.get_rank(),
        seed=seed,
        chunk_size=config.quantization_chunk,
        dense_warmup_exchange=config.dense_warmup_exchange,
        cuda_events=backend == "nccl",  # NCCL waits on a CUDA stream, out of a host clock's sight
    )
    if config.method == "powersgd":
        state.powersgd = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=config.powersgd_rank,
            start_powerSGD_iter=POWERSGD_FIRST_STEP, use_error_feedback=True, warm_start=True, random_seed=seed)
    model.register_comm_hook(state, compression_hook)
    return state
