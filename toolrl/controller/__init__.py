"""Single controller on Ray: resource pools, worker groups, dispatch declared as class data.

The driver holds the schedule; workers run one method when called::

    from toolrl.controller import (Dispatch, RayResourcePool, RayWorkerGroup, Worker,
                                   init_ray, remote)

    class Scorer(Worker):
        @remote(Dispatch.DP_SPLIT)
        def score(self, batch):
            batch["score"] = batch["x"] * 2
            return batch

    init_ray(num_cpus=4)
    group = RayWorkerGroup(RayResourcePool([4], cpus_per_process=1), Scorer)
    out = group.call(Scorer.score, batch)  # split over 4 workers, order kept

This package knows nothing of RL: it moves TensorDicts and calls methods.
"""

from toolrl.controller.cluster import default_temp_dir, init_ray, shutdown_ray
from toolrl.controller.dispatch import DispatchError, DpLayout, Sharded
from toolrl.controller.network import apply_loopback_guard, is_self_routable, outbound_ip
from toolrl.controller.resources import (
    InsufficientResourcesError,
    NodeInventory,
    PlacementRequest,
    RayResourcePool,
    ResourceError,
    ResourcePool,
    ResourcePoolManager,
    check_placement,
    cluster_nodes,
)
from toolrl.controller.worker import (
    Dispatch,
    Execute,
    MeshCoordinate,
    RemoteCallError,
    RemoteSpec,
    RemoteSpecError,
    Worker,
    WorkerContext,
    remote,
)
from toolrl.controller.worker_group import (
    DEFAULT_CALL_TIMEOUT_S,
    GroupFuture,
    RayWorkerGroup,
    RoleHandle,
    RoleSpec,
    WorkerDiedError,
    WorkerGroupError,
    WorkerTimeoutError,
    spawn,
)

__all__ = [
    "DEFAULT_CALL_TIMEOUT_S",
    "Dispatch",
    "DispatchError",
    "DpLayout",
    "Execute",
    "GroupFuture",
    "InsufficientResourcesError",
    "MeshCoordinate",
    "NodeInventory",
    "PlacementRequest",
    "RayResourcePool",
    "RayWorkerGroup",
    "RemoteCallError",
    "RemoteSpec",
    "RemoteSpecError",
    "ResourceError",
    "ResourcePool",
    "ResourcePoolManager",
    "RoleHandle",
    "RoleSpec",
    "Sharded",
    "Worker",
    "WorkerContext",
    "WorkerDiedError",
    "WorkerGroupError",
    "WorkerTimeoutError",
    "apply_loopback_guard",
    "check_placement",
    "cluster_nodes",
    "default_temp_dir",
    "init_ray",
    "is_self_routable",
    "outbound_ip",
    "remote",
    "shutdown_ray",
    "spawn",
]
