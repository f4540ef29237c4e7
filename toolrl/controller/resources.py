"""Resource pools: how many worker processes go on which node, and the Ray reservation for them.

Three layers, each usable on its own:

- `ResourcePool`: a backend-agnostic description (processes per node, how many worker groups
  may share one device, devices per node). Nothing is reserved.
- `RayResourcePool`: the Ray half. One placement group per node entry, one bundle per process,
  ``STRICT_PACK`` so a node's processes stay on one machine; created lazily on first use.
  Bundles are CPU-only when the pool does not use GPUs.
- `ResourcePoolManager`: pools by name plus the role -> pool mapping, built from config. Roles
  mapped to the same pool are colocated (fused into one actor per bundle by the worker group).

Before anything is reserved, `check_placement` verifies per node (not only in total) that every
pool's per-node group fits on some node, because an unsatisfiable ``STRICT_PACK`` placement
group waits forever instead of failing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray._private.state import available_resources_per_node
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

DEFAULT_READY_TIMEOUT_S = 300.0
_EPS = 1e-9


class ResourceError(RuntimeError):
    """A pool cannot be placed on the cluster (misconfigured, too big, or not ready in time)."""


class InsufficientResourcesError(ResourceError):
    """The cluster lacks the resources a set of pools asks for; the message names the shortfall."""


# --- the backend-agnostic description ----------------------------------------------------------
@dataclass
class ResourcePool:
    """Worker processes per node.

    Args:
        process_on_nodes: processes on each node, e.g. ``[8, 8]`` for two nodes of eight.
        max_colocate_count: how many worker groups may share one bundle (device); each asks for
            ``1 / max_colocate_count`` of it. Fused roles count as one group.
        devices_per_node: accelerators on each node (0 for CPU-only pools); bounds the
            processes per node when the pool uses devices.
    """

    process_on_nodes: list[int]
    max_colocate_count: int = 1
    devices_per_node: int = 0

    def __post_init__(self) -> None:
        self.process_on_nodes = list(self.process_on_nodes)
        if not self.process_on_nodes:
            raise ResourceError("a resource pool needs at least one node entry")
        for i, n in enumerate(self.process_on_nodes):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ResourceError(f"process_on_nodes[{i}] must be a positive int, got {n!r}")
        if not isinstance(self.max_colocate_count, int) or self.max_colocate_count < 1:
            raise ResourceError(
                f"max_colocate_count must be a positive int, got {self.max_colocate_count!r}")
        if self.devices_per_node < 0:
            raise ResourceError(f"devices_per_node must be >= 0, got {self.devices_per_node}")
        if self.devices_per_node:
            for i, n in enumerate(self.process_on_nodes):
                if n > self.devices_per_node:
                    raise ResourceError(
                        f"node entry {i} asks for {n} processes but a node has only "
                        f"{self.devices_per_node} devices (one process per device)")

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    @property
    def nnodes(self) -> int:
        return len(self.process_on_nodes)

    def locate(self, rank: int) -> tuple[int, int]:
        """(node entry, local rank) of a global rank; ranks fill node entries in order."""
        if not 0 <= rank < self.world_size:
            raise IndexError(f"rank {rank} outside a pool of {self.world_size}")
        for node, count in enumerate(self.process_on_nodes):
            if rank < count:
                return node, rank
            rank -= count
        raise AssertionError("unreachable")


# --- per-node availability ---------------------------------------------------------------------
@dataclass(frozen=True)
class NodeInventory:
    """One alive node and the resources it has available now."""

    node_id: str
    available: Mapping[str, float]
    address: str = ""

    def label(self) -> str:
        return self.address or self.node_id[:12]


@dataclass(frozen=True)
class PlacementRequest:
    """One ``STRICT_PACK`` group: ``bundles`` copies of ``bundle`` that must share one node."""

    pool: str
    node_entry: int
    bundles: int
    bundle: Mapping[str, float]

    @property
    def demand(self) -> dict[str, float]:
        return {k: v * self.bundles for k, v in self.bundle.items() if v > 0}

    def describe(self) -> str:
        return (f"pool {self.pool!r} node entry {self.node_entry}: {self.bundles} x "
                f"{_fmt(self.bundle)} = {_fmt(self.demand)}")


def _fmt(resources: Mapping[str, float]) -> str:
    def num(v: float) -> str:
        return str(int(v)) if float(v).is_integer() else f"{v:g}"

    inner = ", ".join(f"{k}: {num(v)}" for k, v in sorted(resources.items()) if v > 0)
    return "{" + inner + "}"


def _fits(demand: Mapping[str, float], available: Mapping[str, float]) -> bool:
    return all(available.get(k, 0.0) + _EPS >= v for k, v in demand.items())


def _shortfall(demand: Mapping[str, float], available: Mapping[str, float]) -> dict[str, float]:
    return {k: v - available.get(k, 0.0) for k, v in demand.items()
            if available.get(k, 0.0) + _EPS < v}


def check_placement(requests: Sequence[PlacementRequest], nodes: Sequence[NodeInventory],
                    max_steps: int = 200_000) -> dict[tuple[str, int], str]:
    """Assign every request to a node that can hold all of its bundles, or raise.

    Each request must fit on ONE node (``STRICT_PACK``); requests compete for the same nodes.
    Returns ``{(pool, node_entry): node_id}``.

    Raises:
        InsufficientResourcesError: naming the request that fits no node (and by how much the
            largest node falls short), the resource the cluster lacks in total, or, when both
            pass, the requests that cannot be packed together.
    """
    nodes = [n for n in nodes if n.available is not None]
    inventory = "; ".join(f"{n.label()} {_fmt(n.available)}" for n in nodes) or "no nodes"
    for req in requests:
        if any(_fits(req.demand, n.available) for n in nodes):
            continue
        best = min(nodes, default=None, key=lambda n: sum(
            v / req.demand[k] for k, v in _shortfall(req.demand, n.available).items()))
        short = _shortfall(req.demand, best.available if best else {})
        raise InsufficientResourcesError(
            f"{req.describe()} must fit on ONE node (STRICT_PACK), but no node has that much "
            f"available: the best node {best.label() if best else '-'} is short by "
            f"{_fmt(short)}. Available per node: {inventory}. Spread the pool over more node "
            f"entries (e.g. process_on_nodes=[4, 4] instead of [8]) or ask for less per "
            f"process.")
    total_demand: dict[str, float] = {}
    for req in requests:
        for k, v in req.demand.items():
            total_demand[k] = total_demand.get(k, 0.0) + v
    total_avail: dict[str, float] = {}
    for n in nodes:
        for k, v in n.available.items():
            total_avail[k] = total_avail.get(k, 0.0) + v
    short = _shortfall(total_demand, total_avail)
    if short:
        raise InsufficientResourcesError(
            f"the pools need {_fmt(total_demand)} in all but the cluster has "
            f"{_fmt({k: total_avail.get(k, 0.0) for k in total_demand})} available "
            f"(short by {_fmt(short)}). Requests: "
            f"{'; '.join(r.describe() for r in requests)}. Available per node: {inventory}.")
    assignment = _pack(requests, nodes, max_steps)
    if assignment is None:
        raise InsufficientResourcesError(
            "the pools fit in total but their per-node groups cannot all be placed at once. "
            f"Requests: {'; '.join(r.describe() for r in requests)}. "
            f"Available per node: {inventory}.")
    return assignment


def _pack(requests: Sequence[PlacementRequest], nodes: Sequence[NodeInventory],
          max_steps: int) -> dict[tuple[str, int], str] | None:
    """Exact search (largest request first, symmetric nodes tried once)."""
    keys = sorted({k for r in requests for k in r.demand} | {k for n in nodes for k in n.available})
    order = sorted(requests, key=lambda r: tuple(-r.demand.get(k, 0.0) for k in keys))
    remaining = [dict(n.available) for n in nodes]
    chosen: list[int] = []
    steps = 0

    def search(i: int) -> bool:
        nonlocal steps
        if i == len(order):
            return True
        tried: set[tuple[float, ...]] = set()
        for j, avail in enumerate(remaining):
            steps += 1
            if steps > max_steps:
                return False
            sig = tuple(round(avail.get(k, 0.0), 6) for k in keys)
            if sig in tried or not _fits(order[i].demand, avail):
                continue
            tried.add(sig)
            for k, v in order[i].demand.items():
                avail[k] = avail.get(k, 0.0) - v
            chosen.append(j)
            if search(i + 1):
                return True
            chosen.pop()
            for k, v in order[i].demand.items():
                avail[k] += v
        return False

    if not search(0):
        return None
    return {(r.pool, r.node_entry): nodes[j].node_id for r, j in zip(order, chosen, strict=True)}


def cluster_nodes() -> list[NodeInventory]:
    """Alive nodes of the connected Ray cluster with their currently available resources."""
    alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    try:
        available = available_resources_per_node()
    except Exception:  # older/newer Ray without the developer API: fall back to totals
        available = {nid: n.get("Resources", {}) for nid, n in alive.items()}
    return [NodeInventory(node_id=nid, address=str(n.get("NodeManagerAddress", "")),
                          available={k: float(v) for k, v in available.get(nid, {}).items()})
            for nid, n in alive.items()]


def cluster_has_gpu() -> bool:
    return ray.cluster_resources().get("GPU", 0.0) > 0


# --- the Ray reservation -----------------------------------------------------------------------
@dataclass
class RayResourcePool(ResourcePool):
    """A `ResourcePool` reserved as Ray placement groups (one per node entry, ``STRICT_PACK``).

    Args:
        name: shown in Ray's placement-group names and in error messages.
        use_gpu: reserve one accelerator per bundle; None decides at reservation time from the
            cluster (GPU if the cluster has any).
        cpus_per_process: CPUs reserved in each bundle (fractions are fine).
        accelerator: Ray resource name of the device ("GPU").
        custom_resources: more Ray resources each bundle asks for, e.g. ``{"rollout_node":
            0.01}`` to put the pool on the nodes started with that resource.
    """

    name: str = "pool"
    use_gpu: bool | None = False
    cpus_per_process: float = 1.0
    accelerator: str = "GPU"
    custom_resources: Mapping[str, float] = field(default_factory=dict)
    _pgs: list[PlacementGroup] | None = field(default=None, init=False, repr=False)
    _groups: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cpus_per_process < 0:
            raise ResourceError(f"cpus_per_process must be >= 0, got {self.cpus_per_process}")

    @property
    def uses_gpu(self) -> bool:
        if self.use_gpu is None:
            self.use_gpu = cluster_has_gpu()
        return bool(self.use_gpu)

    def bundle(self) -> dict[str, float]:
        out = {"CPU": float(self.cpus_per_process)}
        if self.uses_gpu:
            out[self.accelerator] = 1.0
        out.update({str(k): float(v) for k, v in self.custom_resources.items()})
        return out

    def requests(self) -> list[PlacementRequest]:
        return [PlacementRequest(self.name, i, n, self.bundle())
                for i, n in enumerate(self.process_on_nodes)]

    @property
    def reserved(self) -> bool:
        return self._pgs is not None

    def placement_groups(self, timeout_s: float = DEFAULT_READY_TIMEOUT_S,
                         check: bool = True) -> list[PlacementGroup]:
        """The pool's placement groups, created (after a per-node check) on first use."""
        if self._pgs is not None:
            return self._pgs
        if check:
            check_placement(self.requests(), cluster_nodes())
        bundle = self.bundle()
        pgs = [placement_group([dict(bundle) for _ in range(n)], strategy="STRICT_PACK",
                               name=f"{self.name}_{id(self):x}_{i}")
               for i, n in enumerate(self.process_on_nodes)]
        try:
            ray.get([pg.ready() for pg in pgs], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            for pg in pgs:
                remove_placement_group(pg)
            raise ResourceError(
                f"placement groups of pool {self.name!r} ({self.process_on_nodes} x "
                f"{_fmt(bundle)}, STRICT_PACK) were not ready after {timeout_s:g} s; "
                f"available per node: "
                f"{'; '.join(f'{n.label()} {_fmt(n.available)}' for n in cluster_nodes())}"
            ) from None
        self._pgs = pgs
        return pgs

    def actor_options(self, rank: int) -> dict[str, Any]:
        """Ray options that pin the actor of ``rank`` to its bundle."""
        node, local = self.locate(rank)
        pg = self.placement_groups()[node]
        share = 1.0 / self.max_colocate_count
        options: dict[str, Any] = {
            "num_cpus": self.cpus_per_process * share,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=local,
                placement_group_capture_child_tasks=False),
        }
        resources = {k: v * share for k, v in self.custom_resources.items()}
        if self.uses_gpu:
            if self.accelerator == "GPU":
                options["num_gpus"] = share
            else:
                resources[self.accelerator] = share
        if resources:
            options["resources"] = resources
        return options

    def claim(self, group: str) -> None:
        """Count a worker group in; at most ``max_colocate_count`` groups share the bundles."""
        if len(self._groups) >= self.max_colocate_count:
            raise ResourceError(
                f"pool {self.name!r} already hosts worker groups {self._groups} and "
                f"max_colocate_count={self.max_colocate_count}; fuse roles into one group "
                f"(RayWorkerGroup(pool, {{role: RoleSpec(...)}})) or raise max_colocate_count")
        self._groups.append(group)

    def unclaim(self, group: str) -> None:
        if group in self._groups:
            self._groups.remove(group)

    def release(self) -> None:
        """Remove the placement groups (actors in them must be gone or are killed by Ray)."""
        for pg in self._pgs or []:
            remove_placement_group(pg)
        self._pgs = None


# --- pools from config --------------------------------------------------------------------------
class ResourcePoolManager:
    """Named pools and the role -> pool mapping.

    Roles mapped to the same pool name share one `RayResourcePool` object; the worker group
    fuses them into one actor per bundle.

    Args:
        pools: pool name -> processes per node, e.g. ``{"global": [4], "reward": [1]}``.
        mapping: role -> pool name, e.g. ``{"actor": "global", "ref": "global"}``.
    """

    def __init__(self, pools: Mapping[str, Sequence[int]], mapping: Mapping[str, str], *,
                 use_gpu: bool | None = False, cpus_per_process: float = 1.0,
                 max_colocate_count: int = 1, devices_per_node: int = 0,
                 custom_resources: Mapping[str, Mapping[str, float]] | None = None) -> None:
        if not pools:
            raise ResourceError("no resource pools configured")
        unknown = {role: p for role, p in mapping.items() if p not in pools}
        if unknown:
            raise ResourceError(
                f"roles mapped to unknown pools: {unknown}; known pools: {sorted(pools)}")
        custom = dict(custom_resources or {})
        stray = sorted(set(custom) - set(pools))
        if stray:
            raise ResourceError(f"custom resources for unknown pools {stray}; known pools: "
                                f"{sorted(pools)}")
        self.mapping = dict(mapping)
        self.pools: dict[str, RayResourcePool] = {
            name: RayResourcePool(list(counts), max_colocate_count=max_colocate_count,
                                  devices_per_node=devices_per_node, name=name, use_gpu=use_gpu,
                                  cpus_per_process=cpus_per_process,
                                  custom_resources=dict(custom.get(name) or {}))
            for name, counts in pools.items()
        }

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> ResourcePoolManager:
        """Build from a mapping with keys ``pools``, ``mapping`` and optional ``use_gpu``
        (true/false/"auto"), ``cpus_per_process``, ``max_colocate_count``, ``devices_per_node``,
        ``custom_resources`` (pool name -> Ray resources each of its bundles asks for).
        """
        known = {"pools", "mapping", "use_gpu", "cpus_per_process", "max_colocate_count",
                 "devices_per_node", "custom_resources"}
        extra = set(cfg) - known
        if extra:
            raise ResourceError(f"unknown resource config keys {sorted(extra)}; "
                                f"known: {sorted(known)}")
        use_gpu = cfg.get("use_gpu", False)
        if use_gpu == "auto":
            use_gpu = None
        elif not isinstance(use_gpu, bool):
            raise ResourceError(f"use_gpu must be true, false or 'auto', got {use_gpu!r}")
        return cls({k: list(v) for k, v in cfg["pools"].items()}, dict(cfg["mapping"]),
                   use_gpu=use_gpu, cpus_per_process=float(cfg.get("cpus_per_process", 1.0)),
                   max_colocate_count=int(cfg.get("max_colocate_count", 1)),
                   devices_per_node=int(cfg.get("devices_per_node", 0)),
                   custom_resources=cfg.get("custom_resources"))

    def pool_for(self, role: str) -> RayResourcePool:
        if role not in self.mapping:
            raise ResourceError(f"role {role!r} has no pool; mapped roles: {sorted(self.mapping)}")
        return self.pools[self.mapping[role]]

    def roles_by_pool(self) -> dict[str, list[str]]:
        """Pool name -> the roles living on it (in mapping order): the colocation plan."""
        out: dict[str, list[str]] = {}
        for role, pool in self.mapping.items():
            out.setdefault(pool, []).append(role)
        return out

    def requests(self) -> list[PlacementRequest]:
        return [r for p in self.pools.values() if not p.reserved for r in p.requests()]

    def check(self, nodes: Sequence[NodeInventory] | None = None) -> None:
        """Raise `InsufficientResourcesError` unless every pool fits the cluster at once."""
        check_placement(self.requests(), cluster_nodes() if nodes is None else nodes)

    def create(self, timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> None:
        """Check all pools together, then reserve them."""
        self.check()
        for pool in self.pools.values():
            pool.placement_groups(timeout_s=timeout_s, check=False)

    def release(self) -> None:
        for pool in self.pools.values():
            pool.release()

    @property
    def total_processes(self) -> int:
        return sum(p.world_size for p in self.pools.values())


__all__ = [
    "DEFAULT_READY_TIMEOUT_S",
    "InsufficientResourcesError",
    "NodeInventory",
    "PlacementRequest",
    "RayResourcePool",
    "ResourceError",
    "ResourcePool",
    "ResourcePoolManager",
    "check_placement",
    "cluster_has_gpu",
    "cluster_nodes",
]
