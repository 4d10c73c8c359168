"""Gradient compression arithmetic, no communication: top-k sparsification with error feedback,
int8 quantization, and the compact encoding of top-k indices.

Top-k, per parameter and step (Deep Gradient Compression, Lin et al. 2018; error feedback, Stich et al.):

    acc       = residual + grad            (residual starts at 0)
    sent      = the k entries of acc with the largest |value|, as (values, indices)
    residual' = acc with the sent entries set to 0

so ``sent + residual' == acc`` holds exactly (entries are copied or zeroed, never rounded): no
gradient mass is lost, it is only delayed. Without error feedback (``topk``) the unsent part is
dropped. ``k`` depends only on the parameter's size and the step's density, so every rank sends
the same number of entries and fixed-size collectives can gather them.

Residuals are keyed by parameter *name*: DDP rebuilds its buckets after the first iteration, so
bucket indices do not identify the same gradients across steps (or across a resume).

Local clipping (DGC): with error feedback, each rank clips its own gradient *before* it enters the
residual (:func:`clip_norm_`, threshold :func:`local_clip_threshold`). Clipping the averaged sparse
gradient afterwards, as a dense step does, would shrink the accumulated entries being delivered
and break the conservation above.

Selection weights: the top-k may rank entries by ``|acc| * weight`` (the trainer passes AdamW's
frozen preconditioner, so entries rank by the step they would make). Only *which* entries are sent
changes; the values sent are ``acc``'s and the conservation holds as before.

int8 quantization (QSGD, Alistarh et al. 2017, with a max-scaled grid): entries share an fp32 scale
per chunk, ``scale = max|x| / 127`` over the chunk, and round stochastically to ``q = floor(x / scale
+ u)`` with ``u ~ U[0, 1)``, so ``E[q * scale] = x`` (unbiased) and ``|q| <= 127`` (no overflow, -128
unused). Chunks never cross a parameter boundary and each parameter draws its own noise from a seed
of (run seed, rank, step, parameter name): a parameter quantizes the same whatever DDP's bucket layout,
and a resumed run draws what an uninterrupted one would, with no generator state to checkpoint. With
error feedback the residual is ``acc - q * scale``, the rounding error, delivered later.

Top-k with int8 values (``topk_int8_ef``): the top-k values of a bucket share one scale (their max,
whatever their order: a resume matches while DDP groups the same parameters), and the quantization error of a sent entry stays in its residual, so ``dequantized sent + residual' == acc``
up to float32 rounding. Indices travel as offsets within their parameter (every rank knows each
parameter's k, so the receiver knows which parameter an offset belongs to) in the smallest type that
holds the bucket's largest parameter: uint16 up to 65536 entries, else int32.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch


def k_for(numel: int, density: float) -> int:
    """Entries sent for a parameter of ``numel`` entries: ceil(numel * density), at least 1."""
    return max(1, min(numel, math.ceil(numel * density - 1e-9)))


def density_at_step(step: int, target: float, dense_warmup_steps: int, decay_steps: int, start: float = 1.0) -> float:
    """Density of global optimizer ``step``: 1.0 during the dense warm-up, then an exponential decay
    from ``start`` to ``target`` over ``decay_steps`` steps (DGC's sparsity warm-up), then ``target``.

    The decay's bytes are its mean density, ``(start - target) / ln(start / target)`` a step: 0.145
    from 1.0 to 0.001, 0.0215 from 0.1 (DGC itself starts at 0.25)."""
    if target >= 1.0 or step < dense_warmup_steps:
        return 1.0
    if decay_steps <= 0 or start <= target:
        return target
    progress = min(1.0, (step - dense_warmup_steps) / decay_steps)
    return max(target, start * (target / start) ** progress)


def local_clip_threshold(grad_clip: float, world_size: int, share: float = 1.0) -> float:
    """Norm bound for one rank's local gradient (or the ``share`` of the model's entries in one bucket).

    DGC scales the global threshold by N^-1/2 for node gradients that each carry 1/N of the average;
    ours are local means (the hook averages), so the same rule is ``grad_clip * sqrt(N)``: the mean of
    N independent gradients within it has norm <= ``grad_clip``. A bucket holding a ``share`` of the
    entries gets ``sqrt(share)`` of it, so buckets at their bounds add up to the model's.
    """
    return grad_clip * math.sqrt(world_size * share)


def clip_norm_(flat: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale ``flat`` in place so its L2 norm is at most ``max_norm``; returns the norm before.

    A non-finite norm makes every entry non-finite (NaN scale), so the step is still skipped everywhere.
    """
    norm = torch.linalg.vector_norm(flat)
    flat.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def select_topk(acc: torch.Tensor, k: int, weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` entries of flat ``acc`` with the largest magnitude (times ``weight``, positive and
    finite, when given): (values of ``acc``, int64 indices).

    Non-finite entries rank first (torch orders NaN above everything), so a NaN gradient is always
    sent and every rank sees it: the step is then skipped everywhere, consistently.
    """
    _, indices = torch.topk(acc.abs() if weight is None else acc.abs() * weight, k, sorted=False)
    return acc[indices], indices


class GatheredGarbage(RuntimeError):
    """A rank's gathered (value, index) pairs cannot be from a well-formed top-k payload."""


def densify(values: list[torch.Tensor], indices: list[torch.Tensor], numel: int, world_size: int,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """Sum every rank's sparse (values, indices) into a dense vector and divide by ``world_size``.

    Indices chosen by several ranks add up. Ranks are added in rank order, so every replica computes
    the same bits. An index outside ``[0, numel)`` raises :class:`GatheredGarbage`.
    """
    dense = torch.zeros(numel, dtype=values[0].dtype, device=values[0].device) if out is None else out.zero_()
    for rank, (v, i) in enumerate(zip(values, indices, strict=True)):
        if i.numel() and (int(i.min()) < 0 or int(i.max()) >= numel):
            raise GatheredGarbage(
                f"the top-k all-gather gave rank {rank}'s indices outside this bucket's {numel} values "
                f"({int(i.min())}..{int(i.max())}): that peer most likely left mid-collective (killed or "
                "crashed) and the backend handed back a partly written buffer. This step is dropped; under "
                "torchrun the round restarts from the last checkpoint. If no rank died, report it: the "
                "ranks disagree on the model's layout")
        dense.index_add_(0, i, v)
    return dense.div_(world_size)


class ErrorFeedback:
    """Per-parameter error-feedback residuals keyed by parameter name (``error_feedback=False``: none).

    New residuals are staged and only become the state on :meth:`commit` (after a successful
    optimizer step); :meth:`discard` (a skipped, non-finite step) leaves the state as it was.
    """

    def __init__(self, error_feedback: bool) -> None:
        self.error_feedback = error_feedback
        self.residuals: dict[str, torch.Tensor] = {}
        self._staged: dict[str, torch.Tensor] = {}

    def accumulate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        """``residual + grad`` (a new tensor; ``grad`` is not modified)."""
        residual = self.residuals.get(name) if self.error_feedback else None
        return grad + residual if residual is not None else grad.clone()

    def stage(self, name: str, residual: torch.Tensor) -> None:
        """Stage ``name``'s next residual: only with error feedback, and only a finite one (a
        non-finite step is skipped everywhere and must not poison the residual)."""
        if self.error_feedback and bool(torch.isfinite(residual).all()):
            self._staged[name] = residual

    def fold_residual(self, name: str, grad: torch.Tensor) -> None:
        """Dense step: add the residual into ``grad`` in place and stage a zero residual."""
        residual = self.residuals.get(name) if self.error_feedback else None
        if residual is not None:
            grad.add_(residual.view_as(grad))
            self._staged[name] = torch.zeros_like(residual)

    @property
    def staged(self) -> dict[str, torch.Tensor]:
        """Residuals computed this step, not yet committed (read-only view for inspection)."""
        return dict(self._staged)

    def commit(self) -> None:
        self.residuals.update(self._staged)
        self._staged.clear()

    def discard(self) -> None:
        self._staged.clear()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: r.detach().cpu().clone() for name, r in self.residuals.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor], device: torch.device | str = "cpu") -> None:
        self.residuals = {name: r.to(device) for name, r in state.items()}
        self._staged.clear()


class TopKCompressor(ErrorFeedback):
    """Per-parameter top-k selection with optional error feedback (see :class:`ErrorFeedback`)."""

    def __init__(self, error_feedback: bool) -> None:
        super().__init__(error_feedback)
        # Flat per-parameter weights the selection ranks |acc| by (set per step from outside; None = raw).
        self.selection_weights: dict[str, torch.Tensor] | None = None

    def compress(self, name: str, grad: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k of the accumulated flat gradient of parameter ``name``; stages the new residual."""
        acc = self.accumulate(name, grad.reshape(-1))
        weight = self.selection_weights.get(name) if self.selection_weights is not None else None
        values, indices = select_topk(acc, k, weight)
        if self.error_feedback and bool(torch.isfinite(acc).all()):
            acc[indices] = 0.0
            self._staged[name] = acc
        return values, indices

    def keep_unsent(self, name: str, indices: torch.Tensor, lost: torch.Tensor) -> None:
        """Add ``lost`` (what quantizing the values sent at ``indices`` took off them) back into the
        staged residual, so error feedback delivers it later. No-op without a staged residual."""
        staged = self._staged.get(name)
        if staged is not None:
            staged.index_add_(0, indices, lost)


# ---- int8 quantization ---------------------------------------------------------------------------

INT8_LEVELS = 127  # symmetric grid: q in [-127, 127]


def chunk_ids(numels: Sequence[int], chunk_size: int) -> torch.Tensor:
    """Chunk number of every entry of ``numels``' segments laid back to back, each segment cut into
    chunks of ``chunk_size`` (its last one shorter): chunks never cross a segment (parameter) boundary."""
    ids, first = [], 0
    for numel in numels:
        ids.append(torch.arange(numel) // chunk_size + first)
        first += math.ceil(numel / chunk_size)
    return torch.cat(ids) if ids else torch.zeros(0, dtype=torch.long)


def chunk_scales(x: torch.Tensor, chunks: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """fp32 scale of every chunk: ``max |x| / 127`` over it (0 for an all-zero chunk, non-finite for a
    chunk holding a non-finite entry, so it dequantizes to non-finite values and the step is skipped)."""
    amax = torch.zeros(num_chunks, dtype=torch.float32, device=x.device)
    return amax.scatter_reduce_(0, chunks.to(x.device), x.abs().float(), "amax").div_(INT8_LEVELS)


def quantize_int8(x: torch.Tensor, scale: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Stochastic rounding of ``x`` on the grid ``scale * [-127, 127]`` (``scale`` per entry, or one
    broadcast): ``floor(x / scale + noise)`` with ``noise ~ U[0, 1)``, so ``E[q * scale] = x``.

    Clamping only catches ``|x| / scale`` rounding a hair past 127. A zero scale gives 0; a non-finite
    one gives 0 too, and its dequantized value is non-finite through the scale.
    """
    level = torch.where(scale > 0, x / scale, torch.zeros_like(x))
    level = torch.nan_to_num(level, nan=0.0, posinf=0.0, neginf=0.0)
    return torch.floor(level + noise).clamp_(-INT8_LEVELS, INT8_LEVELS).to(torch.int8)


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` in fp32 (``scale`` per entry, or one broadcast)."""
    return q.float() * scale


def rounding_seed(seed: int, rank: int, step: int, name: str) -> int:
    """Seed of parameter ``name``'s rounding noise at ``step`` on ``rank``: independent across ranks,
    steps and parameters, and a pure function of them (a resume draws what the first run drew)."""
    digest = hashlib.blake2b(f"{seed}/{rank}/{step}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # torch seeds are 64-bit; stay clear of the sign bit


def rounding_noise(segments: Sequence[tuple[str, int]], seed: int, rank: int, step: int,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """U[0, 1) noise for ``(name, numel)`` segments laid back to back, each from its own seed."""
    parts = []
    for name, numel in segments:
        generator = torch.Generator(device=device).manual_seed(rounding_seed(seed, rank, step, name))
        parts.append(torch.rand(numel, generator=generator, device=device))
    return torch.cat(parts) if parts else torch.zeros(0, device=device)


# ---- compact top-k indices -----------------------------------------------------------------------

def offset_dtype(largest_numel: int) -> torch.dtype:
    """Smallest integer type holding an offset within a parameter of ``largest_numel`` entries."""
    return torch.uint16 if largest_numel <= 2**16 else torch.int32


def bucket_indices(offsets: torch.Tensor, ks: Sequence[int], numels: Sequence[int], rank: int = 0) -> torch.Tensor:
    """Bucket positions (int64) of per-parameter ``offsets``: parameters hold ``ks`` offsets each, in
    bucket order, and span ``numels`` entries. An offset outside its parameter raises
    :class:`GatheredGarbage` (naming ``rank``, whose payload it came from)."""
    offsets = offsets.long()
    counts = torch.tensor(list(ks), device=offsets.device)
    sizes = torch.tensor(list(numels), device=offsets.device)
    starts = torch.cumsum(sizes, 0) - sizes
    limits = torch.repeat_interleave(sizes, counts)
    bad = (offsets < 0) | (offsets >= limits)
    if bool(bad.any()):
        raise GatheredGarbage(
            f"the top-k all-gather gave rank {rank}'s offsets outside their parameters "
            f"({int(offsets[bad][0])} in a parameter of {int(limits[bad][0])} values): that peer most likely "
            "left mid-collective (killed or crashed) and the backend handed back a partly written buffer. "
            "This step is dropped; under torchrun the round restarts from the last checkpoint. If no rank "
            "died, report it: the ranks disagree on the model's layout")
    return offsets + torch.repeat_interleave(starts, counts)
