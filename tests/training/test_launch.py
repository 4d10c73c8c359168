from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.training.launch import JOB_SCRIPT, Torchrun, job_arguments, torchrun_command


def test_torchrun_command_uses_c10d_on_loopback_with_a_free_port_and_restarts():
    cmd = torchrun_command(Torchrun(nproc_per_node=2, max_restarts=1), ["--run-dir", "/x"], run_id="r1")
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--nproc-per-node=2" in cmd and "--max-restarts=1" in cmd
    assert "--rdzv-backend=c10d" in cmd and "--rdzv-endpoint=127.0.0.1:0" in cmd
    assert cmd[-3:] == [str(JOB_SCRIPT), "--run-dir", "/x"]


def test_job_arguments_pass_only_what_was_given():
    assert job_arguments(Path("/r"), "dev", None, None, True) == ["--run-dir", "/r", "--env", "dev"]
    assert job_arguments(Path("/r"), None, Path("/c.toml"), Path("/d"), False) == [
        "--run-dir", "/r", "--config", "/c.toml", "--dataset-root", "/d", "--no-resume"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine: `make gpu-check` itself is the test there")
def test_gpu_check_says_clearly_when_there_is_no_gpu():
    proc = subprocess.run([sys.executable, str(JOB_SCRIPT.parent / "gpu_check.py")], capture_output=True, text=True)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
