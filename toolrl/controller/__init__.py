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

Names load on first use (PEP 562), so the Ray-free parts (dispatch, worker specs, the loopback
guard) import on a machine without Ray; the pools and groups import Ray when first touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what an IDE and a type checker see
    from toolrl.controller.cluster import default_temp_dir, init_ray, shutdown_ray
    from toolrl.controller.dispatch import DispatchError, DpLayout, Sharded
    from toolrl.controller.errors import WorkerDiedError, WorkerGroupError, WorkerTimeoutError
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
        spawn,
    )

_WHERE = {
    "DEFAULT_CALL_TIMEOUT_S": "worker_group",
    "Dispatch": "worker",
    "DispatchError": "dispatch",
    "DpLayout": "dispatch",
    "Execute": "worker",
    "GroupFuture": "worker_group",
    "InsufficientResourcesError": "resources",
    "MeshCoordinate": "worker",
    "NodeInventory": "resources",
    "PlacementRequest": "resources",
    "RayResourcePool": "resources",
    "RayWorkerGroup": "worker_group",
    "RemoteCallError": "worker",
    "RemoteSpec": "worker",
    "RemoteSpecError": "worker",
    "ResourceError": "resources",
    "ResourcePool": "resources",
    "ResourcePoolManager": "resources",
    "RoleHandle": "worker_group",
    "RoleSpec": "worker_group",
    "Sharded": "dispatch",
    "Worker": "worker",
    "WorkerContext": "worker",
    "WorkerDiedError": "errors",
    "WorkerGroupError": "errors",
    "WorkerTimeoutError": "errors",
    "apply_loopback_guard": "network",
    "check_placement": "resources",
    "cluster_nodes": "resources",
    "default_temp_dir": "cluster",
    "init_ray": "cluster",
    "is_self_routable": "network",
    "outbound_ip": "network",
    "remote": "worker",
    "shutdown_ray": "cluster",
    "spawn": "worker_group",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'toolrl.controller' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"toolrl.controller.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


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
