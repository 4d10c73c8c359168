"""Process-group setup and the rank-aware helpers of the training job.

Backend: nccl when CUDA is available, gloo otherwise. Under torchrun the rank and world size come
from the environment (RANK, WORLD_SIZE, LOCAL_RANK); without it the job runs as a world of one.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from pipeline.config import ConfigError

# torchrun's switch (read by its agents) for a new worker store every restart round instead of one
# shared store: what a multi-node job needs to take back a restarted node (see init_distributed).
PER_ROUND_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


class ReplicaMismatch(RuntimeError):
    """Model replicas diverged across ranks: the run cannot be trusted."""


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    backend: str  # "gloo" | "nccl"
    device: torch.device
    local_world_size: int = 1  # processes of this job on this node

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def init_distributed(init_method: str | None = None, rank: int | None = None,
                     world_size: int | None = None) -> DistEnv:
    """Join (or create) the default process group. Explicit arguments serve tests that spawn ranks
    themselves (``init_method="file://..."``); torchrun supplies everything through the environment."""
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if init_method is None and "MASTER_ADDR" not in os.environ and world_size == 1:
            # A lone process (no torchrun): an in-memory store needs no port.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        elif init_method is None and _torchrun_shares_one_store_across_rounds():
            dist.init_process_group(backend, store=_restart_round_store(rank, world_size), rank=rank,
                                    world_size=world_size)
        else:
            # torch's env:// (MASTER_ADDR/PORT from torchrun): under PER_ROUND_STORE_ENV rank 0 hosts
            # a new store on the port the round's rendezvous picked, so no key outlives its round.
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    return DistEnv(rank, world_size, local_rank, backend, device, local_world_size)


class MultiNodeNeedsPerRoundStore(ConfigError):
    """torchrun runs several nodes on one store shared across restart rounds (see PER_ROUND_STORE_ENV)."""


def _torchrun_shares_one_store_across_rounds() -> bool:
    """True when torchrun's agent hosts one store for every restart round (its default); then a
    restarted worker needs the round in its keys (:func:`_restart_round_store`), which only one
    node can count: raises :class:`MultiNodeNeedsPerRoundStore` when there are several."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return False
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    if nodes > 1:
        raise MultiNodeNeedsPerRoundStore(
            f"{nodes} nodes under torchrun with its shared rendezvous store: a node that is restarted "
            f"could not rejoin (its restart count starts again at 0 and torch never hands it the round's "
            f"store address). Start every node's torchrun with {PER_ROUND_STORE_ENV}=1 "
            "(`fraudctl train --nnodes` does)")
    return True


def _restart_round_store(rank: int, world_size: int) -> dist.Store:
    """The rendezvous store of this torchrun restart round: torchrun's store under a per-round prefix.

    torchrun's agent keeps one TCPStore across restart rounds and its workers join it without a
    per-round prefix (torch.distributed.rendezvous assumes a new store per retry). A restarted rank
    could then read the dead round's gloo addresses before its peers overwrite them and fail with
    "connectFullMesh ... Connection refused", the more often the more loaded the host (what the
    SIGKILL test hit). The prefix keeps each round's keys apart; on one node the agent's restart
    count names the round for every worker.
    """
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=default_pg_timeout)
    return dist.PrefixStore(f"fraud-train/restart-{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)


def no_forward_buffer_sync() -> dict[str, bool]:
    """DDP's keyword that stops the per-forward buffer broadcast, in this torch's spelling.

    Torch 2.13 renamed it (``forward_sync_buffers``; ``broadcast_buffers`` warns as deprecated); GPU images
    still ship older torch (2.11 on the device machines), which only knows ``broadcast_buffers``. The old
    spelling also skips the broadcast at start, harmless here: every rank builds its buffers from the
    same manifest and nothing changes them while training.
    """
    parameters = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in parameters else {"broadcast_buffers": False}


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def log_rank0(message: str) -> None:
    """Print once per job (rank 0), flushed so torchrun's merged output stays ordered."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(message, flush=True)


def log_rank(message: str) -> None:
    """Print from every rank, prefixed with the rank (errors and per-rank facts)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    print(f"[rank {rank}] {message}", file=sys.stderr, flush=True)


def parameter_fingerprint(tensors: list[torch.Tensor]) -> int:
    """A 63-bit digest of the exact bytes of ``tensors`` (in order): equal iff bit-identical (w.h.p.)."""
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


def mismatched_ranks(fingerprints: list[int]) -> list[int]:
    """Ranks whose fingerprint differs from rank 0's."""
    return [r for r, f in enumerate(fingerprints) if f != fingerprints[0]]


def check_replicas(model: torch.nn.Module, step: int, device: torch.device) -> None:
    """Collective: compare every rank's parameter fingerprint; raise :class:`ReplicaMismatch` on all
    ranks when any differs."""
    if dist.get_world_size() == 1:
        return
    mine = torch.tensor([parameter_fingerprint(list(model.parameters()))], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    bad = mismatched_ranks([int(t.item()) for t in every])
    if bad:
        raise ReplicaMismatch(
            f"parameters differ across ranks at step {step} (ranks {bad} disagree with rank 0): "
            "the replicas diverged; the run is stopped. Resume from the last checkpoint; if it recurs, "
            "check for nondeterministic kernels or a faulty host")
