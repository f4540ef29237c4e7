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

Names load on first use (``lazy_loader``, as ``toolrl``'s own), so the Ray-free parts (dispatch,
worker specs, the loopback guard) import on a machine without Ray; the pools and groups import
Ray when first touched.
"""

import lazy_loader

# Each public name once, by the module that defines it (`__all__` and `dir` are made from it).
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "cluster": ["default_temp_dir", "init_ray", "shutdown_ray"],
    "dispatch": ["DispatchError", "DpLayout", "Sharded"],
    "errors": ["WorkerDiedError", "WorkerGroupError", "WorkerTimeoutError"],
    "network": ["apply_loopback_guard", "is_self_routable", "outbound_ip"],
    "resources": ["InsufficientResourcesError", "NodeInventory", "PlacementRequest",
                  "RayResourcePool", "ResourceError", "ResourcePool", "ResourcePoolManager",
                  "check_placement", "cluster_nodes"],
    "worker": ["Dispatch", "Execute", "MeshCoordinate", "RemoteCallError", "RemoteSpec",
               "RemoteSpecError", "Worker", "WorkerContext", "remote"],
    "worker_group": ["DEFAULT_CALL_TIMEOUT_S", "GroupFuture", "RayWorkerGroup", "RoleHandle",
                     "RoleSpec", "spawn"],
})
