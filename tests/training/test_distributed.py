"""Replica checksums and process-group setup (single process; 2-process checks in test_comm_hooks)."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from pipeline.training.distributed import mismatched_ranks, no_forward_buffer_sync, parameter_fingerprint


def test_fingerprint_is_equal_for_identical_bits_and_changes_on_one_ulp():
    torch.manual_seed(0)
    params = [torch.randn(4, 3), torch.randn(7)]
    copy = [p.clone() for p in params]
    assert parameter_fingerprint(params) == parameter_fingerprint(copy)
    copy[1][3] = torch.nextafter(copy[1][3], torch.tensor(float("inf")))
    assert parameter_fingerprint(params) != parameter_fingerprint(copy)


def test_fingerprint_depends_on_order():
    a, b = torch.ones(3), torch.zeros(3)
    assert parameter_fingerprint([a, b]) != parameter_fingerprint([b, a])


def test_mismatched_ranks_names_those_that_differ_from_rank0():
    assert mismatched_ranks([5, 5, 5]) == []
    assert mismatched_ranks([5, 6, 5, 7]) == [1, 3]


def test_the_buffer_sync_keyword_is_one_this_torch_takes_without_a_deprecation(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a deprecated spelling would raise FutureWarning here
            ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.BatchNorm1d(3), **no_forward_buffer_sync())
        assert getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", None)) is False
    finally:
        dist.destroy_process_group()
