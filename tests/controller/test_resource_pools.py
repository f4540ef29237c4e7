"""Resource pools: descriptions, the per-node availability check, config, real placement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from toolrl.controller import (
    InsufficientResourcesError,
    NodeInventory,
    PlacementRequest,
    RayResourcePool,
    RayWorkerGroup,
    ResourceError,
    ResourcePool,
    ResourcePoolManager,
    Worker,
    check_placement,
    remote,
)


def nodes(*cpus: float, gpus: tuple[float, ...] = ()) -> list[NodeInventory]:
    out = []
    for i, c in enumerate(cpus):
        avail = {"CPU": c}
        if gpus:
            avail["GPU"] = gpus[i]
        out.append(NodeInventory(node_id=f"node{i}", available=avail, address=f"10.0.0.{i}"))
    return out


def cpu_requests(pool: str, *per_node: int, cpus: float = 1.0) -> list[PlacementRequest]:
    return [PlacementRequest(pool, i, n, {"CPU": cpus}) for i, n in enumerate(per_node)]


# --- the description ----------------------------------------------------------------------
def test_pool_description_ranks_fill_nodes_in_order():
    pool = ResourcePool([2, 3])
    assert pool.world_size == 5 and pool.nnodes == 2
    assert [pool.locate(r) for r in range(5)] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    with pytest.raises(IndexError):
        pool.locate(5)


@pytest.mark.parametrize("kwargs, match", [
    ({"process_on_nodes": []}, "at least one node"),
    ({"process_on_nodes": [2, 0]}, r"process_on_nodes\[1\] must be a positive int"),
    ({"process_on_nodes": [2], "max_colocate_count": 0}, "max_colocate_count"),
    ({"process_on_nodes": [4], "devices_per_node": 2}, "only 2 devices"),
])
def test_pool_description_rejects_bad_values(kwargs, match):
    with pytest.raises(ResourceError, match=match):
        ResourcePool(**kwargs)


def test_ray_pool_bundles_are_cpu_only_without_gpu_and_colocation_shares_them():
    pool = RayResourcePool([2], name="p", use_gpu=False, cpus_per_process=0.5)
    assert pool.bundle() == {"CPU": 0.5}
    gpu_pool = RayResourcePool([2], name="g", use_gpu=True, cpus_per_process=2,
                               devices_per_node=8)
    assert gpu_pool.bundle() == {"CPU": 2.0, "GPU": 1.0}
    assert gpu_pool.requests() == [PlacementRequest("g", 0, 2, {"CPU": 2.0, "GPU": 1.0})]
    shared = RayResourcePool([1], name="s", max_colocate_count=2)
    shared.claim("a")
    shared.claim("b")
    with pytest.raises(ResourceError, match=r"already hosts worker groups \['a', 'b'\]"):
        shared.claim("c")
    shared.unclaim("a")
    shared.claim("c")


# --- per-node availability (pure) ----------------------------------------------------------
def test_one_pool_of_eight_on_two_nodes_of_four_names_the_shortfall():
    with pytest.raises(InsufficientResourcesError) as info:
        check_placement(cpu_requests("global", 8), nodes(4, 4))
    msg = str(info.value)
    assert "pool 'global' node entry 0: 8 x {CPU: 1} = {CPU: 8}" in msg
    assert "ONE node (STRICT_PACK)" in msg and "short by {CPU: 4}" in msg
    assert "10.0.0.0 {CPU: 4}; 10.0.0.1 {CPU: 4}" in msg


def test_per_node_entries_that_fit_are_assigned_to_distinct_nodes():
    assignment = check_placement(cpu_requests("global", 4, 4), nodes(4, 4))
    assert sorted(assignment.values()) == ["node0", "node1"]
    assert set(assignment) == {("global", 0), ("global", 1)}


def test_total_shortfall_is_reported_in_total():
    with pytest.raises(InsufficientResourcesError,
                       match=r"need \{CPU: 12\} in all but the cluster has \{CPU: 8\} available "
                             r"\(short by \{CPU: 4\}\)"):
        check_placement(cpu_requests("a", 4, 4) + cpu_requests("b", 4), nodes(4, 4))


def test_groups_that_fit_in_total_but_not_together_are_reported():
    # 3 + 3 + 2 = 8 CPUs on two nodes of 4: every group fits alone, not all at once.
    requests = cpu_requests("a", 3, 3) + cpu_requests("b", 2)
    with pytest.raises(InsufficientResourcesError, match="cannot all be placed at once"):
        check_placement(requests, nodes(4, 4))
    assert len(check_placement(requests, nodes(5, 3, 0))) == 3


def test_every_resource_must_fit_on_the_same_node():
    # Node 0 has the CPUs, node 1 the GPUs: a 4-GPU pool with 1 CPU per process fits nowhere.
    requests = [PlacementRequest("actor", 0, 4, {"CPU": 1, "GPU": 1})]
    with pytest.raises(InsufficientResourcesError, match=r"short by \{CPU: 2\}"):
        check_placement(requests, nodes(8, 2, gpus=(0, 4)))
    assert check_placement(requests, nodes(8, 4, gpus=(0, 4))) == {("actor", 0): "node1"}


def test_the_search_finds_a_packing_first_fit_would_miss():
    # Largest-first on nodes (7, 5): 4->7 (3 left), 3->3... exact search must still succeed.
    requests = cpu_requests("a", 4) + cpu_requests("b", 3, 3) + cpu_requests("c", 2)
    assignment = check_placement(requests, nodes(7, 5))
    load = {"node0": 0, "node1": 0}
    sizes = {("a", 0): 4, ("b", 0): 3, ("b", 1): 3, ("c", 0): 2}
    for key, node in assignment.items():
        load[node] += sizes[key]
    assert load["node0"] <= 7 and load["node1"] <= 5


# --- config ---------------------------------------------------------------------------------
def test_manager_from_config_colocates_roles_mapped_to_one_pool():
    manager = ResourcePoolManager.from_config({
        "pools": {"global": [2], "reward": [1]},
        "mapping": {"actor": "global", "ref": "global", "rm": "reward"},
        "cpus_per_process": 0.5,
    })
    assert manager.pool_for("actor") is manager.pool_for("ref")
    assert manager.pool_for("rm") is not manager.pool_for("actor")
    assert manager.roles_by_pool() == {"global": ["actor", "ref"], "reward": ["rm"]}
    assert manager.total_processes == 3
    with pytest.raises(InsufficientResourcesError, match="pool 'global'"):
        manager.check(nodes(0.5, 0.5))
    manager.check(nodes(1, 0.5))
    with pytest.raises(ResourceError, match="role 'critic' has no pool"):
        manager.pool_for("critic")


@pytest.mark.parametrize("cfg, match", [
    ({"pools": {"g": [1]}, "mapping": {"actor": "gg"}}, r"unknown pools: \{'actor': 'gg'\}"),
    ({"pools": {"g": [1]}, "mapping": {}, "gpus": 1}, r"unknown resource config keys \['gpus'\]"),
    ({"pools": {"g": [1]}, "mapping": {}, "use_gpu": "yes"}, "use_gpu must be"),
    ({"pools": {}, "mapping": {}}, "no resource pools"),
])
def test_manager_config_errors(cfg, match):
    with pytest.raises(ResourceError, match=match):
        ResourcePoolManager.from_config(cfg)


def test_manager_auto_gpu_is_decided_at_reservation_time():
    manager = ResourcePoolManager.from_config(
        {"pools": {"g": [1]}, "mapping": {"a": "g"}, "use_gpu": "auto"})
    assert manager.pools["g"].use_gpu is None


# --- real Ray --------------------------------------------------------------------------------
class Noop(Worker):
    @remote()
    def ping(self) -> int:
        return self.rank


def test_pool_larger_than_the_node_fails_at_once_on_the_real_cluster(ray_cluster):
    pool = RayResourcePool([2], name="huge", cpus_per_process=1000)
    with pytest.raises(InsufficientResourcesError, match=r"pool 'huge' .* short by \{CPU: 19"):
        RayWorkerGroup(pool, Noop)
    assert not pool.reserved and pool._groups == []


_CLUSTER_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import ray
    from ray.cluster_utils import Cluster
    from toolrl.controller import (InsufficientResourcesError, RayResourcePool, RayWorkerGroup,
                                   Worker, cluster_nodes, init_ray, remote)

    class Where(Worker):
        @remote()
        def node(self):
            return ray.get_runtime_context().get_node_id()

    temp = sys.argv[1]
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "temp_dir": temp, "include_dashboard": False})
    cluster.add_node(num_cpus=4)
    cluster.wait_for_nodes()
    os.environ["RAY_ADDRESS"] = cluster.address
    result = {}
    try:
        init_ray()  # connects to RAY_ADDRESS instead of starting a cluster
        result["nodes"] = len(cluster_nodes())
        try:
            RayWorkerGroup(RayResourcePool([8], name="global", cpus_per_process=1), Where,
                           ready_timeout_s=60)
        except InsufficientResourcesError as e:
            result["error"] = str(e)
        pool = RayResourcePool([2, 2], name="split", cpus_per_process=2)
        group = RayWorkerGroup(pool, Where, ready_timeout_s=120)
        result["placement"] = group.call(Where.node)
        group.shutdown()
        pool.release()
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("RESULT " + json.dumps(result))
""")


@pytest.mark.slow
def test_two_node_cluster_per_node_check_and_strict_pack():
    """A real two-node cluster (4 CPUs each), in a subprocess: it cannot share the session's."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with tempfile.TemporaryDirectory(prefix="rt-") as temp:
        env["RAY_TMPDIR"] = temp  # Cluster writes its address file under <temp>/ray
        os.makedirs(os.path.join(temp, "ray"))
        proc = subprocess.run([sys.executable, "-c", _CLUSTER_SCRIPT,
                               os.path.join(temp, "ray")], env=env,
                              capture_output=True, text=True, timeout=240)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["nodes"] == 2
    assert "pool 'global' node entry 0: 8 x {CPU: 1} = {CPU: 8}" in result["error"]
    assert "short by {CPU: 4}" in result["error"]
    placement = result["placement"]
    assert placement[0] == placement[1] and placement[2] == placement[3]
    assert placement[0] != placement[2]
