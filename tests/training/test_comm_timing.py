"""Exposed-communication timing (pipeline/training/comm_hooks.py): the host clock for gloo, CUDA
events for NCCL, read once per epoch record."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pipeline.training.comm_hooks import CommState, CommTiming, register_compression
from pipeline.training.config import CompressionConfig


class FixedWait:
    """Stands in for a DeviceWait: ``seconds()`` as the GPU would report, counting its reads."""

    def __init__(self, seconds: float) -> None:
        self.value, self.reads = seconds, 0

    def seconds(self) -> float:
        self.reads += 1
        return self.value


def _state(**kwargs) -> CommState:
    return CommState(method="allreduce", world_size=2, names={}, **kwargs)


def test_the_host_clock_takes_the_rest_of_backward_after_the_last_launch():
    state = _state()
    state.begin_step(1.0, dense=True)
    started = time.perf_counter()
    state.launched(started, started + 0.001)
    state.launched(started + 0.002, time.perf_counter())  # the last launch counts
    time.sleep(0.05)
    state.end_backward()
    assert 0.05 <= state.step_wait_s < 5 and state.step_device_waits == []
    timing = CommTiming()
    timing.add(0.2, state)
    record = timing.record(25.0)
    assert record["comm_wait_clock"] == "host"
    assert record["comm_wait_s"] == state.step_wait_s and record["comm_wait_share"] == state.step_wait_s / 0.2


def test_device_waits_are_read_when_the_epoch_is_recorded_and_only_once():
    timing = CommTiming()
    waits = [FixedWait(0.25), FixedWait(0.5)]
    for wait in waits:  # two steps under NCCL: the host clock saw nothing
        state = _state(cuda_events=True)
        state.begin_step(1.0, dense=True)
        state.step_device_waits.append(wait)
        timing.add(1.0, state)
    assert [w.reads for w in waits] == [0, 0]  # no synchronisation per step
    record = timing.record(25.0)
    assert (record["comm_wait_clock"], record["comm_wait_s"], record["comm_wait_share"]) == ("cuda_events", 0.75, 0.375)
    assert timing.record(25.0)["comm_wait_s"] == 0.75 and [w.reads for w in waits] == [1, 1]


def test_a_new_step_forgets_the_last_steps_waits():
    state = _state(cuda_events=True)
    state.step_device_waits.append(FixedWait(1.0))
    state.begin_step(1.0, dense=True)
    assert state.step_device_waits == [] and state.step_wait_s == 0.0


@pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(), reason="needs a GPU and NCCL")
def test_under_nccl_the_wait_is_timed_with_cuda_events(tmp_path):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("nccl", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(8))).cuda()
        ddp = DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=1)
        state = register_compression(ddp, CompressionConfig(method="allreduce"), "nccl")
        assert state.cuda_events
        timing = CommTiming()
        for step in range(3):
            state.begin_step(1.0, dense=True, step=step)
            started = time.perf_counter()
            ddp(torch.randn(256, 1024, device="cuda")).square().mean().backward()
            state.end_backward()
            assert len(state.step_device_waits) == 1 and state.step_wait_s == 0.0
            timing.add(time.perf_counter() - started, state)
        record = timing.record(1.0)
        assert record["comm_wait_clock"] == "cuda_events" and record["comm_wait_s"] > 0
    finally:
        dist.destroy_process_group()
