"""Which device and process-group backend a worker picks: CPU tests stay on gloo on a GPU box,
and a GPU group carries CPU tensors too (issue 35)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from fsdp_harness import run_ranks

from toolrl.workers.fsdp import all_reduce, default_backend, default_device


@pytest.fixture
def cuda_visible(monkeypatch):
    """Pretend one GPU is visible (what the lent GPU box looks like to torch)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_a_gpu_group_also_carries_cpu_tensors():
    assert default_backend(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"
    assert default_backend(torch.device("cpu")) == "gloo"


def test_toolrl_device_keeps_a_process_on_the_cpu(cuda_visible, monkeypatch):
    monkeypatch.delenv("TOOLRL_DEVICE", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert default_device() == torch.device("cuda", 0)  # LOCAL_RANK modulo the visible GPUs
    monkeypatch.setenv("TOOLRL_DEVICE", "cpu")
    assert default_device() == torch.device("cpu")
    monkeypatch.setenv("TOOLRL_DEVICE", "tpu")
    with pytest.raises(ValueError, match="TOOLRL_DEVICE"):
        default_device()


def _device_and_backend(rank):
    total = all_reduce(torch.tensor([rank + 1.0]))
    return str(default_device()), dist.get_backend(), float(total)


def test_two_cpu_ranks_stay_on_gloo_where_a_gpu_is_visible(cuda_visible):
    """Two forked CPU ranks on a box with one GPU: NCCL would refuse two ranks on one GPU and
    a forked child cannot use CUDA, so the harness's ranks keep to the CPU and gloo."""
    for device, backend, total in run_ranks(_device_and_backend, 2, timeout_s=60):
        assert (device, backend, total) == ("cpu", "gloo", 3.0)
