"""Worker groups on the real local Ray cluster (the session's `ray_cluster`)."""

from __future__ import annotations

import functools
import os
import signal
import sys

import pytest
import ray
import torch
import torch.distributed as dist
from tensordict import TensorDict

from toolrl.batch import get_non_tensor, set_meta, set_non_tensor
from toolrl.controller import (
    Dispatch,
    Execute,
    RayResourcePool,
    RayWorkerGroup,
    RemoteCallError,
    ResourcePoolManager,
    RoleSpec,
    Worker,
    WorkerDiedError,
    WorkerGroupError,
    WorkerTimeoutError,
    remote,
    spawn,
)

# Test modules are not importable inside Ray workers: ship this module's classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Scorer(Worker):
    """A toy single-process class: scores a batch, keeps some state."""

    def __init__(self, offset: float) -> None:
        self.offset = offset
        self.last_rows: list[int] = []

    @remote(Dispatch.DP_SPLIT)
    def score(self, batch: TensorDict) -> TensorDict:
        self.last_rows = batch["row"].tolist()
        batch["score"] = batch["x"].float().pow(2).sum(-1) + self.offset
        rows = get_non_tensor(batch, "rows")
        set_non_tensor(batch, "rows", [{**r, "scored": True} for r in rows])
        return batch

    @remote(Dispatch.DP_SPLIT)
    def double(self, batch: TensorDict) -> TensorDict:
        batch["score"] = batch["score"] * 2
        return batch

    @remote(Dispatch.DP_SPLIT_RAW)
    def count(self, batch: TensorDict) -> dict:
        return {"rank": self.rank, "rows": batch["row"].tolist()}

    @remote(Dispatch.ONE_TO_ALL)
    def setup_mesh(self, tp: int) -> None:
        self.register_mesh("tp", dp_rank=self.rank // tp, is_collect=self.rank % tp == 0)

    @remote(Dispatch.DP_SPLIT, mesh="tp")
    def tagged(self, batch: TensorDict) -> TensorDict:
        self.last_rows = batch["row"].tolist()
        batch["src"] = torch.full((batch.batch_size[0],), self.rank)
        return batch

    @remote(Dispatch.DP_SPLIT_RAW, mesh="tp")
    def tagged_raw(self, batch: TensorDict) -> int:
        return self.rank

    @remote(Dispatch.ONE_TO_ALL)
    def seen(self) -> list[int]:
        return self.last_rows

    @remote(Dispatch.ONE_TO_ALL)
    def total(self, batch: TensorDict, extra: int = 0) -> int:
        return int(batch["x"].sum()) + extra + self.rank

    @remote(Dispatch.ONE_TO_ALL)
    def dist_env(self) -> dict[str, str]:
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "CUDA_VISIBLE_DEVICES")
        return {k: os.environ[k] for k in keys} | {"pid": str(os.getpid())}

    @remote(Dispatch.ALL_TO_ALL)
    def all_reduce(self, value: float) -> list[float]:
        backend = self.init_process_group()
        try:
            t = torch.tensor([value, 1.0])
            dist.all_reduce(t)
            return [backend, *t.tolist()]
        finally:
            self.destroy_process_group()

    @remote(Dispatch.ONE_TO_ALL, Execute.RANK_ZERO)
    def whoami(self) -> int:
        return self.rank

    @remote(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"bad row on rank {rank}")
        return self.rank

    @remote(Dispatch.ONE_TO_ALL)
    async def async_rank(self) -> int:
        return self.rank

    def helper(self) -> int:  # not remote
        return 0


class Other(Worker):
    @remote()
    def seen(self) -> list[int]:
        return []


def make_batch(n: int) -> TensorDict:
    td = TensorDict({"x": torch.arange(n * 4).reshape(n, 4), "row": torch.arange(n)},
                    batch_size=[n])
    set_non_tensor(td, "rows", [{"id": i, "tools": [{"name": "add"}]} for i in range(n)])
    set_meta(td, "step", 3)
    return td


@pytest.fixture(scope="module")
def group4(ray_cluster):
    pool = RayResourcePool([4], name="controller-test", cpus_per_process=0.1)
    group = RayWorkerGroup(pool, Scorer, 1.5, call_timeout_s=120, ready_timeout_s=120)
    yield group
    group.shutdown()
    pool.release()


def test_toy_class_becomes_a_four_worker_group_with_the_same_results(group4):
    def run(score):  # the toy "training script": only how `score` is made differs
        return score(make_batch(10))

    local = run(Scorer(1.5).score)
    distributed = run(functools.partial(group4.call, Scorer.score))
    assert group4.world_size == 4
    torch.testing.assert_close(distributed["score"], local["score"])
    assert get_non_tensor(distributed, "rows") == get_non_tensor(local, "rows")
    assert get_non_tensor(distributed, "rows")[0] == {"id": 0, "tools": [{"name": "add"}],
                                                      "scored": True}
    assert group4.call(Scorer.seen) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 1]]


@pytest.mark.parametrize("n", [1, 3, 5, 6, 9])
def test_dp_split_of_uneven_batches_returns_the_input_order_and_size(group4, n):
    batch = make_batch(n)
    out = group4.call(Scorer.score, batch)
    assert out.batch_size == torch.Size([n])
    assert out["row"].tolist() == list(range(n))
    assert torch.equal(out["x"], batch["x"])
    assert [r["id"] for r in get_non_tensor(out, "rows")] == list(range(n))
    assert out.get_non_tensor("step") == 3


def test_dp_split_raw_returns_one_output_per_worker(group4):
    out = group4.call(Scorer.count, make_batch(6))
    assert [o["rank"] for o in out] == [0, 1, 2, 3]
    assert [o["rows"] for o in out] == [[0, 1], [2, 3], [4, 5], [0, 1]]


def test_futures_are_handed_to_a_later_call(group4):
    batch = make_batch(7)
    first = group4.call_async(Scorer.score, batch)
    second = group4.call_async(Scorer.double, first)  # shards stay on the workers
    assert all(isinstance(args[0], ray.ObjectRef) for args, _ in second.plan.calls)
    out = second.get()
    expected = Scorer(1.5).score(make_batch(7))["score"] * 2
    torch.testing.assert_close(out["score"], expected)
    assert out["row"].tolist() == list(range(7))
    # The earlier future can still be collected on its own, and handed over by keyword.
    torch.testing.assert_close(first.get()["score"], expected / 2)
    third = group4.call_async(Scorer.double, batch=group4.call_async(Scorer.score, batch))
    assert all(isinstance(kw["batch"], ray.ObjectRef) for _, kw in third.plan.calls)
    torch.testing.assert_close(third.get()["score"], expected)


def test_mesh_collects_one_source_per_dp_rank_and_feeds_replicas_the_same_shard(group4):
    group4.call(Scorer.setup_mesh, 2)  # tp=2: ranks (0,1) are dp 0, ranks (2,3) are dp 1
    out = group4.call(Scorer.tagged, make_batch(5))
    assert out["row"].tolist() == [0, 1, 2, 3, 4]
    assert out["src"].tolist() == [0, 0, 0, 2, 2]  # tp rank 0 of each dp group only
    seen = group4.call(Scorer.seen)
    assert seen[0] == seen[1] == [0, 1, 2] and seen[2] == seen[3] == [3, 4, 0]
    assert group4.call(Scorer.tagged_raw, make_batch(4)) == [0, 2]


def test_one_to_all_broadcasts_a_batch_stored_once(group4):
    batch = make_batch(8)
    pending = group4.call_async(Scorer.total, batch, extra=1)
    refs = [args[0] for args, _ in pending.plan.calls]
    assert isinstance(refs[0], ray.ObjectRef) and len(set(refs)) == 1
    assert pending.get() == [int(batch["x"].sum()) + 1 + r for r in range(4)]


def test_rank_zero_and_all_to_all_and_async_methods(group4):
    assert group4.call(Scorer.whoami) == 0
    assert group4.call(Scorer.async_rank) == [0, 1, 2, 3]


def test_env_is_set_before_construction_and_gloo_all_reduce_sums(group4):
    envs = group4.call(Scorer.dist_env)
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["WORLD_SIZE"] for e in envs} == {e["LOCAL_WORLD_SIZE"] for e in envs} == {"4"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {""}  # a CPU pool sees no GPU
    assert [int(e["pid"]) for e in envs] == group4.pids and len(set(group4.pids)) == 4
    out = group4.call(Scorer.all_reduce, [1.0, 2.0, 3.0, 4.0])
    assert out == [["gloo", 10.0, 4.0]] * 4


def test_calling_a_method_without_a_spec_names_it(group4):
    with pytest.raises(RemoteCallError, match=r"Scorer\.helper has no @remote spec.*"
                                              r"remote methods of Scorer: all_reduce"):
        group4.call(Scorer.helper)
    with pytest.raises(RemoteCallError, match=r"Other\.seen is not a method of Scorer"):
        group4.call(Other.seen)
    with pytest.raises(RemoteCallError, match="pass the method itself"):
        group4.call("score", make_batch(2))
    with pytest.raises(TypeError, match=r"bad arguments for Scorer\.score"):
        group4.call(Scorer.score)


def test_worker_exception_keeps_its_type_and_names_the_rank(group4):
    with pytest.raises(ValueError, match="bad row on rank 2") as info:
        group4.call(Scorer.fail_on, 2)
    assert any("role 'Scorer', rank 2" in note for note in info.value.__notes__)
    assert group4.call(Scorer.fail_on, -1) == [0, 1, 2, 3]  # the group is still usable


class ActorRole(Worker):
    def __init__(self, tag: str) -> None:
        self.tag = tag

    @remote()
    def pid(self) -> int:
        return os.getpid()

    @remote()
    def save_checkpoint(self, path: str) -> str:
        return f"actor {self.tag} rank {self.rank}: {path}"

    @remote(Dispatch.DP_SPLIT)
    def update(self, batch: TensorDict) -> TensorDict:
        batch["y"] = batch["x"] + 1
        return batch


class RefRole(Worker):
    @remote()
    def pid(self) -> int:
        return os.getpid()

    @remote()
    def save_checkpoint(self, path: str) -> str:
        return f"ref rank {self.rank}: {path}"


def test_colocated_roles_share_one_process_per_bundle(ray_cluster):
    manager = ResourcePoolManager.from_config({
        "pools": {"global": [2], "reward": [1]},
        "mapping": {"actor": "global", "ref": "global", "actor2": "global", "rm": "reward"},
        "cpus_per_process": 0.1,
    })
    handles = spawn(manager, {"actor": RoleSpec.of(ActorRole, "a"), "ref": RefRole,
                              "actor2": RoleSpec.of(ActorRole, "b"), "rm": RefRole},
                    call_timeout_s=120)
    actor, ref, rm = handles["actor"], handles["ref"], handles["rm"]
    fused = actor.group
    try:
        assert ref.group is fused and handles["actor2"].group is fused and rm.group is not fused
        actor_pids, ref_pids = actor.call(ActorRole.pid), ref.call(RefRole.pid)
        assert actor_pids == ref_pids == fused.pids and len(set(actor_pids)) == 2
        assert len(rm.call(RefRole.pid)) == 1 and rm.call(RefRole.pid)[0] not in actor_pids
        assert actor.call(ActorRole.save_checkpoint, "d") == ["actor a rank 0: d",
                                                              "actor a rank 1: d"]
        assert ref.call(RefRole.save_checkpoint, "d") == ["ref rank 0: d", "ref rank 1: d"]
        assert handles["actor2"].call(ActorRole.save_checkpoint, "e")[1] == "actor b rank 1: e"
        out = actor.call(ActorRole.update, make_batch(3))
        assert out["y"].tolist() == (make_batch(3)["x"] + 1).tolist()
        with pytest.raises(RemoteCallError, match=r"fuses roles \['actor', 'ref', 'actor2'\]"):
            fused.call(ActorRole.pid)
        with pytest.raises(RemoteCallError, match=r"RefRole\.save_checkpoint is not a method "
                                                  r"of ActorRole \(role 'actor'"):
            actor.call(RefRole.save_checkpoint, "d")
        with pytest.raises(KeyError, match="has no role 'critic'"):
            fused.role("critic")
    finally:
        fused.shutdown()
        rm.group.shutdown()
        manager.release()


class Sleeper(Worker):
    @remote()
    def sleep(self, seconds: float) -> int:
        import time

        time.sleep(seconds)
        return self.rank


def test_a_killed_worker_raises_naming_role_and_rank_instead_of_hanging(ray_cluster):
    pool = RayResourcePool([2], name="doomed", cpus_per_process=0.1)
    group = RayWorkerGroup(pool, Sleeper, name="sleepers", call_timeout_s=120)
    try:
        pending = group.call_async(Sleeper.sleep, 300.0)
        with pytest.raises(WorkerTimeoutError, match=r"Sleeper\.sleep .* did not finish within "
                                                     r"0\.5 s; ranks still running: \[0, 1\]"):
            pending.get(timeout=0.5)
        os.kill(group.pids[1], signal.SIGKILL)  # crash mid-call
        with pytest.raises(WorkerDiedError, match=r"group 'sleepers', role 'Sleeper', rank 1 "
                                                  r"\(pid \d+\) died during Sleeper\.sleep"):
            pending.get(timeout=60)  # the bound only matters if the failure were not noticed
        with pytest.raises(WorkerDiedError, match="rank 1"):
            group.call_async(Sleeper.sleep, 0.0).get(timeout=60)
    finally:
        group.shutdown()
        pool.release()
    with pytest.raises(WorkerGroupError, match="'sleepers' is shut down"):
        group.call(Sleeper.sleep, 0.0)
