"""GPU paths: GPU bundles, fractional colocation on one device, NCCL (skipped without CUDA)."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("ray", reason="the GPU pools run on Ray")
import ray
import torch
import torch.distributed as dist

from toolrl.controller import Dispatch, RayResourcePool, RayWorkerGroup, Worker, remote

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.gpu


class CudaWorker(Worker):
    @remote()
    def info(self) -> dict:
        return {"device": str(self.device), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    @remote(Dispatch.ALL_TO_ALL)
    def all_reduce(self, value: float) -> list:
        backend = self.init_process_group()
        try:
            t = torch.tensor([value], device=self.device)
            dist.all_reduce(t)
            return [backend, t.item()]
        finally:
            self.destroy_process_group()


def test_gpu_pool_gives_each_worker_a_device_and_nccl_all_reduce_sums(ray_cluster):
    n = min(2, torch.cuda.device_count())
    pool = RayResourcePool([n], name="gpu", use_gpu=True, cpus_per_process=0.1,
                           devices_per_node=torch.cuda.device_count())
    assert pool.bundle()["GPU"] == 1.0
    with RayWorkerGroup(pool, CudaWorker, call_timeout_s=300) as group:
        info = group.call(CudaWorker.info)
        assert all(i["device"].startswith("cuda") for i in info)
        assert len({tuple(i["gpu_ids"]) for i in info}) == n  # one device each
        out = group.call(CudaWorker.all_reduce, [float(r + 1) for r in range(n)])
        assert out == [["nccl", float(n * (n + 1) // 2)]] * n
    pool.release()


def test_two_groups_share_one_gpu_bundle_when_colocation_allows(ray_cluster):
    pool = RayResourcePool([1], name="shared-gpu", use_gpu=True, cpus_per_process=0.2,
                           max_colocate_count=2, devices_per_node=torch.cuda.device_count())
    assert pool.actor_options(0)["num_gpus"] == 0.5
    with RayWorkerGroup(pool, CudaWorker, name="a") as a, \
            RayWorkerGroup(pool, CudaWorker, name="b") as b:
        assert a.call(CudaWorker.info)[0]["gpu_ids"] == b.call(CudaWorker.info)[0]["gpu_ids"]
    pool.release()


def test_auto_gpu_pool_uses_the_gpu(ray_cluster):
    pool = RayResourcePool([1], name="auto", use_gpu=None, cpus_per_process=0.1)
    assert pool.uses_gpu and pool.bundle()["GPU"] == 1.0
