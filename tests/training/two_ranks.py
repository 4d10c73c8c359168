"""Run scenario functions on two real gloo processes and collect what each rank returned.

Each scenario is a module-level function ``scenario(rank) -> dict`` (picklable by reference, as
``mp.spawn`` needs); both ranks run every scenario in order, so they can use collectives. The
result maps each scenario's name to ``[rank 0's dict, rank 1's dict]``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

Scenario = Callable[[int], dict]


def _run(rank: int, store_file: str, out_file: str, scenarios: Sequence[Scenario]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    try:
        results = {}
        for scenario in scenarios:
            every = [None, None]
            dist.all_gather_object(every, scenario(rank))
            results[scenario.__name__] = every
        if rank == 0:
            Path(out_file).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def run_on_two_ranks(scenarios: Sequence[Scenario], tmp: Path) -> dict[str, list[dict]]:
    """Spawn two gloo ranks in ``tmp`` (its file store and result), run ``scenarios``, return the results."""
    out = tmp / "out.json"
    mp.spawn(_run, args=(str(tmp / "store"), str(out), list(scenarios)), nprocs=2, join=True)
    return json.loads(out.read_text())
