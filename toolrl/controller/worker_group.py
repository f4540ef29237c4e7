"""`RayWorkerGroup`: one Ray actor per bundle of a resource pool, called like one object.

::

    group = RayWorkerGroup(pool, ActorWorker, model_path)        # rank i on bundle i
    out = group.call(ActorWorker.compute_log_probs, batch)         # split, run, collect
    fut = group.call_async(ActorWorker.compute_log_probs, batch)   # futures ...
    group.call(ActorWorker.update, fut)                            # ... handed to a later call

Colocation: several roles fused into one actor per bundle, one handle per role::

    fused = RayWorkerGroup(pool, {"actor": RoleSpec(ActorWorker, path),
                                  "ref": RoleSpec(RefWorker, path)})
    fused.role("actor").call(ActorWorker.save_checkpoint, d)       # no name collision
    fused.role("ref").call(RefWorker.save_checkpoint, d)

Every wait is bounded: a call waits at most ``call_timeout_s`` (or ``get(timeout=...)``), a
dead worker raises `WorkerDiedError` naming its role and rank as soon as Ray notices, and an
exception inside a worker is re-raised with a note naming the role, rank and method.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import inspect
import os
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from tensordict import TensorDict

from toolrl.controller.dispatch import (
    DpLayout,
    Plan,
    Sharded,
    batch_location,
    gather,
    scatter,
)
from toolrl.controller.errors import WorkerDiedError, WorkerGroupError, WorkerTimeoutError
from toolrl.controller.network import free_port
from toolrl.controller.resources import (
    DEFAULT_READY_TIMEOUT_S,
    RayResourcePool,
    ResourceError,
    ResourcePoolManager,
)
from toolrl.controller.worker import (
    Dispatch,
    MeshCoordinate,
    RemoteCallError,
    RemoteSpec,
    Worker,
    WorkerContext,
)

DEFAULT_CALL_TIMEOUT_S = 3600.0  # generous (a long rollout or update), never infinite
STACKS_SIGNAL = signal.SIGUSR2  # a worker writes the stacks of all its threads when sent it


@dataclass(frozen=True)
class RoleSpec:
    """A worker class with its constructor arguments: one role of a (fused) group."""

    worker_cls: type[Worker]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.worker_cls, type) and issubclass(self.worker_cls, Worker)):
            raise TypeError(f"a role needs a subclass of toolrl.controller.Worker, got "
                            f"{self.worker_cls!r}")

    @classmethod
    def of(cls, worker_cls: type[Worker], *args: Any, **kwargs: Any) -> RoleSpec:
        return cls(worker_cls, args, kwargs)


class _WorkerHost:
    """The Ray actor: holds one instance per role, all in this one process."""

    def __init__(self, group: str, early: Sequence[Callable[[], object]] = ()) -> None:
        self._group = group
        self._roles: dict[str, Worker] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        for start in early:  # the roles' `Worker.early_start`, before their imports
            start()

    def master_endpoint(self) -> tuple[str, int]:
        """Rank 0 publishes its node address and a free port for torch.distributed."""
        return ray.util.get_node_ip_address(), free_port()

    def setup(self, context: WorkerContext, roles: dict[str, RoleSpec],
              env: dict[str, str]) -> int:
        """Set the distributed environment, then construct each role. Returns the pid."""
        os.environ.update(context.env())
        os.environ.update(env)
        for name, spec in roles.items():
            self._roles[name] = spec.worker_cls(*spec.args, **dict(spec.kwargs))
        return os.getpid()

    def stacks_file(self) -> int:
        """Arm `STACKS_SIGNAL`: the signal makes this process write every thread's Python
        stack (faulthandler, in C: it works while the actor's thread is stuck) to an unlinked
        file; returns its descriptor, read as ``/proc/<pid>/fd/<fd>`` on this node."""
        if getattr(self, "_stacks", None) is None:
            self._stacks = tempfile.TemporaryFile("w+")  # noqa: SIM115 (the process's life)
            faulthandler.register(STACKS_SIGNAL, file=self._stacks, all_threads=True)
        return self._stacks.fileno()

    def execute(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self._roles[role], method)(*args, **kwargs)
        if inspect.isawaitable(result):
            # One persistent loop per worker, so async engines keep their loop across calls.
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(result)
        return result

    def mesh_coordinate(self, role: str, mesh: str) -> MeshCoordinate | None:
        return self._roles[role].mesh_coordinate(mesh)


_HostActor = ray.remote(_WorkerHost)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return type(err).__name__


class GroupFuture:
    """The pending result of `RoleHandle.call_async`; pass it to a later call or `get` it.

    Handed to a later ``DP_SPLIT`` call of a group with the same dp layout, the shards stay
    on the workers (each worker receives its own shard's object reference).
    """

    def __init__(self, handle: RoleHandle, spec: RemoteSpec, plan: Plan, layout: DpLayout,
                 refs: list[ray.ObjectRef]) -> None:
        self._handle = handle
        self.spec = spec
        self.plan = plan
        self.layout = layout
        self.refs = refs
        self._done = False
        self._value: Any = None

    def get(self, timeout: float | None = None) -> Any:
        """Wait (at most ``timeout`` s, by default the group's ``call_timeout_s``) and collect."""
        if not self._done:
            timeout = self._handle.group.call_timeout_s if timeout is None else timeout
            outputs = self._handle.group._wait(self._handle.role, self.spec, self.plan.ranks,
                                               self.refs, timeout)
            self._value = gather(self.spec, outputs, self.plan, self.layout)
            self._done = True
        return self._value

    def sharded_for(self, layout: DpLayout) -> Sharded | None:
        """Per-dp-rank output references, if this was a DP_SPLIT call with ``layout``'s size."""
        if self.spec.dispatch is not Dispatch.DP_SPLIT or self._done:
            return None
        if layout.dp_size != self.layout.dp_size:
            return None
        return Sharded(tuple(self.refs[w] for w in self.layout.sources()), self.plan.pad)

    def __repr__(self) -> str:
        return (f"GroupFuture({self.spec.owner}.{self.spec.name} on {self._handle.group.name}"
                f"[{self._handle.role}], {len(self.refs)} workers)")


class RoleHandle:
    """Calls one role of a worker group (the only role, or one of a fused group)."""

    def __init__(self, group: RayWorkerGroup, role: str) -> None:
        self.group = group
        self.role = role
        self.worker_cls = group._roles[role].worker_cls

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def call(self, method: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` (e.g. ``ActorWorker.update``) on the group as its spec says; block."""
        return self.call_async(method, *args, **kwargs).get()

    def call_async(self, method: Callable[..., Any], /, *args: Any,
                   **kwargs: Any) -> GroupFuture:
        """Like `call`, returning a `GroupFuture` at once."""
        spec = self._spec(method)
        if not self.group._hosts:
            raise WorkerGroupError(f"group {self.group.name!r} is shut down")
        layout = self.group._layout(self.role, spec)
        args, kwargs = self._resolve_futures(spec, args, kwargs, layout)
        plan = scatter(spec, args, kwargs, layout)
        hosts = self.group._hosts
        if spec.dispatch is Dispatch.ONE_TO_ALL and len(plan.ranks) > 1:
            plan = _share_large_args(plan)
        refs = [hosts[r].execute.remote(self.role, spec.name, *a, **kw)
                for r, (a, kw) in zip(plan.ranks, plan.calls, strict=True)]
        return GroupFuture(self, spec, plan, layout, refs)

    def _spec(self, method: Callable[..., Any]) -> RemoteSpec:
        cls = self.worker_cls
        func = getattr(method, "__func__", method)  # a bound method names its function
        name = getattr(func, "__name__", None)
        if isinstance(method, str) or name is None or not callable(func):
            raise RemoteCallError(
                f"pass the method itself, e.g. group.call({cls.__name__}.some_method, ...), "
                f"not {method!r}")
        if not any(vars(k).get(name) is func for k in cls.__mro__):
            raise RemoteCallError(
                f"{getattr(func, '__qualname__', name)} is not a method of {cls.__qualname__} "
                f"(role {self.role!r} of group {self.group.name!r})")
        spec = cls.__remote__.get(name)
        if spec is None:
            known = ", ".join(sorted(cls.__remote__)) or "none"
            raise RemoteCallError(
                f"{cls.__qualname__}.{name} has no @remote spec, so a worker group cannot call "
                f"it; decorate it with @remote(Dispatch....) (remote methods of "
                f"{cls.__qualname__}: {known})")
        return spec

    def _resolve_futures(self, spec: RemoteSpec, args: tuple[Any, ...],
                         kwargs: Mapping[str, Any],
                         layout: DpLayout) -> tuple[tuple[Any, ...], dict[str, Any]]:
        where = batch_location(spec, args, kwargs) if spec.dispatch.splits else None

        def resolve(value: Any, is_batch: bool) -> Any:
            if not isinstance(value, GroupFuture):
                return value
            if is_batch:
                sharded = value.sharded_for(layout)
                if sharded is not None:
                    return sharded
            return value.get()

        new_args = tuple(resolve(a, where == ("args", i)) for i, a in enumerate(args))
        new_kwargs = {k: resolve(v, where == ("kwargs", k)) for k, v in kwargs.items()}
        return new_args, new_kwargs


def _share_large_args(plan: Plan) -> Plan:
    """Put a broadcast tensor/TensorDict in the object store once instead of once per worker."""
    args, kwargs = plan.calls[0]

    def share(v: Any) -> Any:
        return ray.put(v) if isinstance(v, torch.Tensor | TensorDict) else v

    shared = (tuple(share(a) for a in args), {k: share(v) for k, v in kwargs.items()})
    return Plan(plan.ranks, tuple(shared for _ in plan.ranks), plan.pad, plan.padded_size)


class RayWorkerGroup:
    """Worker actors placed on a `RayResourcePool`, rank ``i`` on bundle ``i``.

    Args:
        pool: where the workers go.
        worker_cls: a `Worker` subclass, or a mapping role name -> `RoleSpec` (or class) to fuse
            several roles into one actor per bundle.
        *init_args: constructor arguments of ``worker_cls`` (single-class groups).
        init_kwargs: constructor keyword arguments of ``worker_cls``.
        name: label used in errors (default: the role names).
        call_timeout_s: the longest any call waits unless ``get(timeout=...)`` says otherwise.
        ready_timeout_s: the longest start-up (placement, actor start, constructors) may take.
        env: extra environment variables set in each worker before its roles are constructed.
    """

    def __init__(self, pool: RayResourcePool,
                 worker_cls: type[Worker] | Mapping[str, RoleSpec | type[Worker]],
                 *init_args: Any, init_kwargs: Mapping[str, Any] | None = None,
                 name: str | None = None, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
                 ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
                 env: Mapping[str, str] | None = None) -> None:
        if isinstance(worker_cls, Mapping):
            if init_args or init_kwargs:
                raise TypeError("a fused group takes constructor arguments per role "
                                "(RoleSpec(cls, args, kwargs)), not *init_args")
            if not worker_cls:
                raise TypeError("a fused group needs at least one role")
            roles = {str(r): s if isinstance(s, RoleSpec) else RoleSpec(s)
                     for r, s in worker_cls.items()}
        else:
            spec = RoleSpec(worker_cls, tuple(init_args), dict(init_kwargs or {}))
            roles = {worker_cls.__name__: spec}
        if call_timeout_s <= 0 or ready_timeout_s <= 0:
            raise ValueError("timeouts must be positive (a wait without a bound can hang)")
        self.pool = pool
        self.name = name or "+".join(roles)
        self.call_timeout_s = float(call_timeout_s)
        self._roles = roles
        self._layouts: dict[tuple[str, str], DpLayout] = {}
        self._identity = DpLayout.identity(pool.world_size)
        self._hosts: list[Any] = []
        self.pids: list[int] = []
        self._stack_fds: list[int] = []
        self.waiting: str | None = None  # the call the driver waits on now (stall reports)
        pool.claim(self.name)
        try:
            self._start(float(ready_timeout_s), dict(env or {}))
        except BaseException:
            self.shutdown()
            raise

    @classmethod
    def colocated(cls, pool: RayResourcePool, roles: Mapping[str, RoleSpec | type[Worker]],
                  **options: Any) -> RayWorkerGroup:
        """Fuse ``roles`` into one actor per bundle (same as passing the mapping directly)."""
        return cls(pool, roles, **options)

    def _start(self, ready_timeout_s: float, env: dict[str, str]) -> None:
        deadline = time.monotonic() + ready_timeout_s
        pool = self.pool
        pool.placement_groups(timeout_s=ready_timeout_s)
        options = [pool.actor_options(rank) for rank in range(pool.world_size)]
        early = [f for spec in self._roles.values()
                 if (f := spec.worker_cls.early_start(*spec.args, **spec.kwargs)) is not None]
        self._hosts = [_HostActor.options(max_restarts=0, **opts).remote(self.name, early)
                       for opts in options]
        # Ray leaves every GPU visible to actors that reserved none: hide them from CPU pools,
        # so `Worker.device` and the default backend match what the pool reserved.
        hidden = {} if pool.uses_gpu else {"CUDA_VISIBLE_DEVICES": ""}
        role0 = next(iter(self._roles))
        addr, port = self._get_one(self._hosts[0].master_endpoint.remote(), role0, 0,
                                   "start-up", deadline)
        refs = []
        for rank, host in enumerate(self._hosts):
            node, local = pool.locate(rank)
            ctx = WorkerContext(rank=rank, world_size=pool.world_size, local_rank=local,
                                local_world_size=pool.process_on_nodes[node], master_addr=addr,
                                master_port=port)
            refs.append(host.setup.remote(ctx, self._roles, {**hidden, **env}))
        self.pids = [self._get_one(ref, role0, rank, "start-up (constructors)", deadline)
                     for rank, ref in enumerate(refs)]
        self._stack_fds = [self._get_one(h.stacks_file.remote(), role0, rank, "start-up",
                                         deadline) for rank, h in enumerate(self._hosts)]

    def _get_one(self, ref: ray.ObjectRef, role: str, rank: int, what: str,
                 deadline: float) -> Any:
        try:
            return ray.get(ref, timeout=max(deadline - time.monotonic(), 0.001))
        except GetTimeoutError:
            raise WorkerTimeoutError(
                f"group {self.name!r}: rank {rank} not ready for {what} before the start-up "
                f"timeout (placement or constructor too slow?)") from None
        except RayActorError as e:
            raise WorkerDiedError(f"group {self.name!r}: rank {rank} died during {what}: "
                                  f"{_first_line(e)}") from e
        except RayTaskError as e:
            e.add_note(f"(raised in group {self.name!r}, role {role!r}, rank {rank}, {what})")
            if "No module named" in str(e):
                e.add_note("Workers import worker classes by module path: install the package "
                           "that defines them, or ship a script's module by value with "
                           "ray.cloudpickle.register_pickle_by_value(module)")
            raise

    # --- calls ------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.pool.world_size

    @property
    def roles(self) -> list[str]:
        return list(self._roles)

    def role(self, name: str) -> RoleHandle:
        """The handle of one role of a fused group."""
        if name not in self._roles:
            raise KeyError(f"group {self.name!r} has no role {name!r}; roles: {self.roles}")
        return RoleHandle(self, name)

    def _only_role(self) -> RoleHandle:
        if len(self._roles) != 1:
            raise RemoteCallError(f"group {self.name!r} fuses roles {self.roles}; call through "
                                  f"group.role(name).call(...)")
        return RoleHandle(self, next(iter(self._roles)))

    def call(self, method: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on the group as its `remote` spec says and return the collected
        result (see `RoleHandle.call`)."""
        return self._only_role().call(method, *args, **kwargs)

    def call_async(self, method: Callable[..., Any], /, *args: Any,
                   **kwargs: Any) -> GroupFuture:
        """Like `call`, returning a `GroupFuture` at once."""
        return self._only_role().call_async(method, *args, **kwargs)

    def _layout(self, role: str, spec: RemoteSpec) -> DpLayout:
        if spec.mesh is None:
            return self._identity
        key = (role, spec.mesh)
        if key not in self._layouts:
            refs = [h.mesh_coordinate.remote(role, spec.mesh) for h in self._hosts]
            ranks = tuple(range(self.world_size))
            coords = self._wait(role, spec, ranks, refs, self.call_timeout_s)
            self._layouts[key] = DpLayout.from_coordinates(spec.mesh, coords)
        return self._layouts[key]

    def _wait(self, role: str, spec: RemoteSpec, ranks: tuple[int, ...],
              refs: list[ray.ObjectRef], timeout: float) -> list[Any]:
        """Values of ``refs`` in order; fail fast on the first dead worker or error."""
        try:
            return self._wait_all(role, spec, ranks, refs, timeout)
        finally:
            self.waiting = None

    def _wait_all(self, role: str, spec: RemoteSpec, ranks: tuple[int, ...],
                  refs: list[ray.ObjectRef], timeout: float) -> list[Any]:
        deadline = time.monotonic() + timeout
        index = {ref: i for i, ref in enumerate(refs)}
        values: list[Any] = [None] * len(refs)
        pending = list(refs)
        what = f"{spec.owner}.{spec.name}"
        while pending:
            self.waiting = (f"{what} on group {self.name!r} (role {role!r}), ranks "
                            f"{self._ranks_pids(sorted(ranks[index[r]] for r in pending))}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                running = sorted(ranks[index[r]] for r in pending)
                raise WorkerTimeoutError(
                    f"{what} on group {self.name!r} (role {role!r}) did not finish within "
                    f"{timeout:g} s; ranks still running: {running}")
            ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
            for ref in ready:
                rank = ranks[index[ref]]
                try:
                    values[index[ref]] = ray.get(ref, timeout=max(remaining, 1.0))
                except RayActorError as e:
                    raise WorkerDiedError(
                        f"worker of group {self.name!r}, role {role!r}, rank {rank} "
                        f"(pid {self.pids[rank] if rank < len(self.pids) else '?'}) died "
                        f"during {what}: {_first_line(e)}") from e
                except RayTaskError as e:
                    e.add_note(f"(raised by {what} in group {self.name!r}, role {role!r}, "
                               f"rank {rank})")
                    raise
        return values

    def _ranks_pids(self, ranks: list[int]) -> str:
        return ", ".join(f"{r} (pid {self.pids[r] if r < len(self.pids) else '?'})"
                         for r in ranks)

    # --- diagnostics ------------------------------------------------------------------------
    def dump_stacks(self, directory: str | os.PathLike, settle_s: float = 1.0) -> list[str]:
        """Write every worker's Python stacks (all threads) into ``directory``, one file per
        rank (``<group>-rank<r>-pid<pid>.txt``), without a call to the worker: a signal
        (`STACKS_SIGNAL`) that works while its actor thread is stuck. Workers on other nodes
        are skipped (their processes cannot be signalled from here). Returns the files."""
        out = []
        sent = []
        for rank, (pid, fd) in enumerate(zip(self.pids, self._stack_fds, strict=False)):
            src = f"/proc/{pid}/fd/{fd}"
            if not os.path.exists(src):
                continue
            with contextlib.suppress(OSError):
                os.kill(pid, STACKS_SIGNAL)
                sent.append((rank, pid, src))
        time.sleep(settle_s)  # faulthandler writes from the signal handler, at once
        for rank, pid, src in sent:
            dest = os.path.join(os.fspath(directory),
                                f"{self.name.replace('+', '_')}-rank{rank}-pid{pid}.txt")
            try:
                with open(src) as f:
                    text = f.read()
            except OSError as e:
                text = f"(stacks unreadable: {e})"
            with open(dest, "w") as f:
                f.write(text)
            out.append(dest)
        return out

    # --- lifetime ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Kill the workers (the pool stays reserved for other groups; release it yourself)."""
        for host in self._hosts:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(host, no_restart=True)
        self._hosts = []
        self.pool.unclaim(self.name)

    def __enter__(self) -> RayWorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (f"RayWorkerGroup({self.name!r}, roles={self.roles}, "
                f"world_size={self.world_size}, pool={self.pool.name!r})")


def spawn(manager: ResourcePoolManager, roles: Mapping[str, RoleSpec | type[Worker]],
          **options: Any) -> dict[str, RoleHandle]:
    """One (fused) worker group per pool of ``manager``, one handle per role.

    Roles that the manager maps to the same pool share one actor per bundle. ``options`` go to
    every `RayWorkerGroup`. Shut the groups down with ``handle.group.shutdown()``.
    """
    unknown = sorted(set(roles) - set(manager.mapping))
    if unknown:
        raise ResourceError(f"roles {unknown} have no pool; mapped roles: "
                            f"{sorted(manager.mapping)}")
    manager.create()
    handles: dict[str, RoleHandle] = {}
    groups: list[RayWorkerGroup] = []
    try:
        for pool_name, pool_roles in manager.roles_by_pool().items():
            fused = {r: roles[r] for r in pool_roles if r in roles}
            if not fused:
                continue
            group = RayWorkerGroup(manager.pools[pool_name], fused, **options)
            groups.append(group)
            handles.update({r: group.role(r) for r in fused})
    except BaseException:
        for group in groups:
            group.shutdown()
        raise
    return handles


__all__ = [
    "DEFAULT_CALL_TIMEOUT_S",
    "GroupFuture",
    "RayWorkerGroup",
    "RoleHandle",
    "RoleSpec",
    "WorkerDiedError",
    "WorkerGroupError",
    "WorkerTimeoutError",
    "spawn",
]
