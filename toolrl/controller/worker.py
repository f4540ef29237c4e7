"""The `Worker` base class and the `remote` decorator that declares how a method spreads.

A worker method says how a group call is split and run::

    class ActorWorker(Worker):
        @remote(Dispatch.DP_SPLIT)
        def update(self, batch: TensorDict) -> TensorDict: ...

The decorator records a frozen `RemoteSpec`; when the class is created, `Worker.__init_subclass__`
validates every spec and stores the table as ordinary class data, ``ActorWorker.__remote__``
(method name -> spec, parents' specs inherited). Mistakes fail at import: an unknown mode, a
split mode on a method without a batch argument, ``RANK_ZERO`` with a non-broadcast mode, a spec
on something that is not a method of a Worker subclass. The method itself stays the plain
function, so ``ActorWorker().update(td)`` still works in one process, and the driver calls
``group.call(ActorWorker.update, td)`` with the real function object.

Inside a group, each worker process gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT in its environment before the worker class is constructed, so
`Worker.init_process_group` (or any ``env://`` init) finds them.
"""

from __future__ import annotations

import enum
import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

import torch
import torch.distributed as dist

F = TypeVar("F", bound=Callable[..., Any])


class Dispatch(enum.Enum):
    """How the arguments of a group call reach the workers and how outputs come back."""

    ONE_TO_ALL = "one_to_all"  # same arguments to every worker; a list of outputs (rank order)
    ALL_TO_ALL = "all_to_all"  # every argument is a per-worker list; a list of outputs
    DP_SPLIT = "dp_split"  # split the batch over dp ranks; concatenate, trim padding, keep order
    DP_SPLIT_RAW = "dp_split_raw"  # same split; per-dp-rank outputs as a list (e.g. metrics)

    @property
    def splits(self) -> bool:
        return self in (Dispatch.DP_SPLIT, Dispatch.DP_SPLIT_RAW)


class Execute(enum.Enum):
    """Which workers run the body."""

    ALL = "all"
    RANK_ZERO = "rank_zero"  # only rank 0 (side effects once); its output is returned as is


class RemoteSpecError(TypeError):
    """A `remote` declaration is invalid; raised while the class is being created."""


class RemoteCallError(TypeError):
    """A group call names a method that has no spec in the worker class's table."""


@dataclass(frozen=True)
class RemoteSpec:
    """How one worker method is dispatched, executed and collected.

    Attributes:
        name: the method's name in its class.
        dispatch: the `Dispatch` mode.
        execute: the `Execute` mode.
        batch_arg: for split modes, the parameter holding the TensorDict to split.
        mesh: for split modes, the named mesh whose dp ranks and collect sources are used;
            None means every worker is its own dp rank and a collect source.
        owner: qualified name of the class that declared the spec.
    """

    name: str
    dispatch: Dispatch
    execute: Execute = Execute.ALL
    batch_arg: str | None = None
    mesh: str | None = None
    owner: str = ""
    signature: inspect.Signature | None = field(default=None, compare=False, repr=False)

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> inspect.BoundArguments:
        """Check a call's arguments against the method's signature (``self`` excluded)."""
        if self.signature is None:
            raise RemoteCallError(f"{self.owner}.{self.name} has no signature recorded")
        try:
            return self.signature.bind(None, *args, **kwargs)
        except TypeError as e:
            raise TypeError(f"bad arguments for {self.owner}.{self.name}: {e}") from None


def _coerce(value: Any, enum_cls: type[enum.Enum], what: str, where: str) -> Any:
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        for member in enum_cls:
            if value in (member.name, member.value):
                return member
    known = ", ".join(m.name for m in enum_cls)
    raise RemoteSpecError(f"{where}: unknown {what} {value!r}; expected one of: {known}")


class _RemoteMarker:
    """Placeholder the decorator leaves in a class body until the class exists."""

    def __init__(self, func: Callable[..., Any], dispatch: Any, execute: Any,
                 batch_arg: str | None, mesh: str | None) -> None:
        self.func = func
        self.dispatch = dispatch
        self.execute = execute
        self.batch_arg = batch_arg
        self.mesh = mesh

    def __set_name__(self, owner: type, name: str) -> None:
        if not (isinstance(owner, type) and issubclass(owner, Worker)):
            raise RemoteSpecError(
                f"@remote on {owner.__qualname__}.{name}: {owner.__qualname__} is not a "
                f"subclass of toolrl.controller.Worker")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RemoteSpecError(
            f"{self.func.__qualname__} carries @remote but was never attached to a Worker "
            f"subclass")


def remote(dispatch: Dispatch | str = Dispatch.ONE_TO_ALL, execute: Execute | str = Execute.ALL,
           *, batch_arg: str | None = None, mesh: str | None = None) -> Callable[[F], F]:
    """Declare a worker method callable through a worker group.

    Args:
        dispatch: how arguments are spread (a `Dispatch` or its name).
        execute: which workers run it (an `Execute` or its name).
        batch_arg: for split modes, the parameter holding the batch; by default the first
            parameter after ``self``.
        mesh: for split modes, the mesh (registered by workers with `Worker.register_mesh`)
            that maps workers to dp ranks and collect sources.
    """

    def decorator(func: F) -> F:
        where = f"@remote on {getattr(func, '__qualname__', repr(func))}"
        if isinstance(func, staticmethod | classmethod | property):
            raise RemoteSpecError(f"{where}: @remote goes on a plain method, not a "
                                  f"{type(func).__name__}")
        if not inspect.isfunction(func):
            raise RemoteSpecError(f"{where}: @remote goes on a method, got {type(func).__name__}")
        parts = func.__qualname__.split(".")
        if len(parts) < 2 or parts[-2] == "<locals>":
            raise RemoteSpecError(f"{where}: @remote goes on a method defined in a Worker class "
                                  f"body, not on a free function")
        params = list(inspect.signature(func).parameters.values())
        if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                inspect.Parameter.POSITIONAL_OR_KEYWORD):
            raise RemoteSpecError(f"{where}: a worker method takes self as its first parameter")
        marker = _RemoteMarker(
            func, _coerce(dispatch, Dispatch, "dispatch mode", where),
            _coerce(execute, Execute, "execute mode", where), batch_arg, mesh)
        return marker  # type: ignore[return-value]  # replaced by func in __init_subclass__

    return decorator


def _make_spec(cls: type, name: str, marker: _RemoteMarker) -> RemoteSpec:
    where = f"@remote on {cls.__qualname__}.{name}"
    sig = inspect.signature(marker.func)
    params = list(sig.parameters.values())[1:]
    batch_arg = marker.batch_arg
    if marker.dispatch.splits:
        named = [p for p in params if p.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                     inspect.Parameter.VAR_KEYWORD)]
        if batch_arg is None:
            if not named:
                raise RemoteSpecError(
                    f"{where}: {marker.dispatch.name} splits a batch, but the method has no "
                    f"batch argument (add a parameter for the TensorDict, or use ONE_TO_ALL)")
            batch_arg = named[0].name
        elif batch_arg not in {p.name for p in named}:
            raise RemoteSpecError(
                f"{where}: batch_arg={batch_arg!r} is not a parameter of the method "
                f"(parameters: {[p.name for p in named]})")
    else:
        if batch_arg is not None:
            raise RemoteSpecError(f"{where}: batch_arg only applies to DP_SPLIT/DP_SPLIT_RAW, "
                                  f"not {marker.dispatch.name}")
        if marker.mesh is not None:
            raise RemoteSpecError(f"{where}: mesh only applies to DP_SPLIT/DP_SPLIT_RAW, "
                                  f"not {marker.dispatch.name}")
    if marker.execute is Execute.RANK_ZERO and marker.dispatch is not Dispatch.ONE_TO_ALL:
        raise RemoteSpecError(f"{where}: Execute.RANK_ZERO runs one worker, so it needs "
                              f"Dispatch.ONE_TO_ALL, not {marker.dispatch.name}")
    if marker.mesh is not None and (not isinstance(marker.mesh, str) or not marker.mesh):
        raise RemoteSpecError(f"{where}: mesh must be a non-empty string, got {marker.mesh!r}")
    return RemoteSpec(name=name, dispatch=marker.dispatch, execute=marker.execute,
                      batch_arg=batch_arg, mesh=marker.mesh, owner=cls.__qualname__,
                      signature=sig)


class RemoteTable(Mapping[str, RemoteSpec]):
    """Read-only method name -> `RemoteSpec` table of one worker class."""

    def __init__(self, specs: Mapping[str, RemoteSpec]) -> None:
        self._specs = dict(specs)

    def __getitem__(self, name: str) -> RemoteSpec:
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"RemoteTable({sorted(self._specs)})"


def _build_table(cls: type) -> RemoteTable:
    specs: dict[str, RemoteSpec] = {}
    for base in reversed(cls.__mro__[1:]):
        specs.update(getattr(base, "__dict__", {}).get("__remote__", {}))
    for name, value in list(cls.__dict__.items()):
        if isinstance(value, _RemoteMarker):
            specs[name] = _make_spec(cls, name, value)
            setattr(cls, name, value.func)
    for name in specs:
        attr = inspect.getattr_static(cls, name, None)
        if not inspect.isfunction(attr):
            raise RemoteSpecError(
                f"{cls.__qualname__}.{name} overrides a @remote method of a base class with a "
                f"non-method ({type(attr).__name__}); it must stay a method")
    return RemoteTable(specs)


@dataclass(frozen=True)
class WorkerContext:
    """Where a worker sits in its group (read from the environment the group sets)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerContext:
        env = os.environ if environ is None else environ
        port = env.get("MASTER_PORT")
        return cls(rank=int(env.get("RANK", 0)), world_size=int(env.get("WORLD_SIZE", 1)),
                   local_rank=int(env.get("LOCAL_RANK", 0)),
                   local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
                   master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                   master_port=int(port) if port else None)

    def env(self) -> dict[str, str]:
        """The torch.distributed ``env://`` variables for this worker."""
        out = {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
               "LOCAL_RANK": str(self.local_rank), "LOCAL_WORLD_SIZE": str(self.local_world_size),
               "MASTER_ADDR": self.master_addr}
        if self.master_port is not None:
            out["MASTER_PORT"] = str(self.master_port)
        return out


@dataclass(frozen=True)
class MeshCoordinate:
    """A worker's place in a named mesh: its dp rank and whether its output is collected."""

    dp_rank: int
    is_collect: bool = True


class Worker:
    """Base class of every group worker. Subclasses declare group methods with `remote`.

    The same class runs in one process (rank 0 of 1) or in a group; `rank`, `world_size`,
    `local_rank` and `device` are right in both.
    """

    __remote__: ClassVar[Mapping[str, RemoteSpec]]

    def __new__(cls, *args: Any, **kwargs: Any) -> Worker:
        self = super().__new__(cls)
        self._worker_context = WorkerContext.from_env()
        self._meshes: dict[str, MeshCoordinate] = {}
        return self

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__remote__ = _build_table(cls)

    @classmethod
    def early_start(cls, *args: Any, **kwargs: Any) -> Callable[[], object] | None:
        """Slow start-up work a group runs in this worker's process as soon as it exists,
        before the constructors' modules are even imported (called with the constructor's
        arguments, on the driver). A picklable callable (a module-level function, or a
        partial of one), or None (the default)."""
        return None

    # --- place in the group ---------------------------------------------------------------
    @property
    def context(self) -> WorkerContext:
        return self._worker_context

    @property
    def rank(self) -> int:
        return self._worker_context.rank

    @property
    def world_size(self) -> int:
        return self._worker_context.world_size

    @property
    def local_rank(self) -> int:
        return self._worker_context.local_rank

    @property
    def device(self) -> torch.device:
        """``cuda:<current>`` when a GPU is visible to this process, else ``cpu``."""
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    # --- torch.distributed ----------------------------------------------------------------
    def init_process_group(self, backend: str | None = None,
                           timeout_s: float = 600.0) -> str:
        """Join the group-wide torch.distributed process group (``env://``).

        ``backend`` defaults to ``"cpu:gloo,cuda:nccl"`` when this worker has a GPU (NCCL for
        CUDA tensors, gloo for CPU ones: an NCCL-only group refuses CPU tensors) and ``gloo``
        otherwise. Returns the backend used.
        """
        if dist.is_initialized():
            return str(dist.get_backend())
        if self._worker_context.master_port is None:
            raise RuntimeError("MASTER_PORT is not set: init_process_group runs inside a "
                               "worker group (or set RANK/WORLD_SIZE/MASTER_* yourself)")
        uses_cuda = self.device.type == "cuda"
        if backend is None:
            backend = "cpu:gloo,cuda:nccl" if uses_cuda else "gloo"
        kwargs: dict[str, Any] = {}
        if uses_cuda and "nccl" in backend:
            torch.cuda.set_device(self.device)
            kwargs["device_id"] = self.device
        dist.init_process_group(backend=backend, init_method="env://", rank=self.rank,
                                world_size=self.world_size, timeout=timedelta(seconds=timeout_s),
                                **kwargs)
        return backend

    def destroy_process_group(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # --- mesh-aware dispatch --------------------------------------------------------------
    def register_mesh(self, name: str, dp_rank: int, is_collect: bool = True) -> None:
        """Say where this worker sits in mesh ``name``: split methods declared with
        ``mesh=name`` send it dp shard ``dp_rank``; its output is kept only if ``is_collect``
        (e.g. only tensor-parallel rank 0 of each dp group). Register before the first call
        that uses the mesh: the group reads the layout once and keeps it.
        """
        if dp_rank < 0:
            raise ValueError(f"dp_rank must be >= 0, got {dp_rank}")
        self._meshes[name] = MeshCoordinate(int(dp_rank), bool(is_collect))

    def mesh_coordinate(self, name: str) -> MeshCoordinate | None:
        """This worker's coordinate in mesh ``name`` (None if it never registered it)."""
        return self._meshes.get(name)


Worker.__remote__ = _build_table(Worker)

__all__ = [
    "Dispatch",
    "Execute",
    "MeshCoordinate",
    "RemoteCallError",
    "RemoteSpec",
    "RemoteSpecError",
    "RemoteTable",
    "Worker",
    "WorkerContext",
    "remote",
]
