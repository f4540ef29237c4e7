"""Actor -> vLLM weight sync: gather the full state dict, stream it in buckets, count versions.

Two routes, chosen by placement:

- colocated (each actor rank's process also hosts a rollout engine, or only rank 0's does):
  `WeightSync.push_local` gathers the full weights on every rank one bucket at a time
  (``DTensor.full_tensor``) and hands each local engine's ``load_weights`` an iterator over
  them;
- split pools (rollout workers on their own devices): a dedicated process group between actor
  rank 0 (its rank 0) and the rollout workers, independent of the actors' FSDP group
  (`WeightSyncGroup`: its own TCP store and a gloo or NCCL group object, so a process can
  belong to it besides its default group). `WeightSync.push_group` broadcasts a header (policy
  version, names, shapes, dtypes, bucket layout) and then one flat byte buffer per bucket;
  `WeightSyncGroup.receive` on every rollout worker rebuilds the tensors and feeds them to its
  engine.

The split-pool push gathers the sharded parameters to rank 0 with the
``torch.distributed.checkpoint`` state-dict API (``full_state_dict=True, cpu_offload=True``);
only rank 0 sends. Both gathers are collectives: all actor ranks call a push together.
``lm_head.weight`` is skipped when the embeddings are tied (the checkpoint, and so the engine,
does not have it). The policy version goes up by one on every push.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from toolrl.workers.fsdp import all_reduce, full_state_dict, rank, ties_embeddings

Named = tuple[str, torch.Tensor]
DEFAULT_BUCKET_MB = 256.0


# --- buckets and checksums --------------------------------------------------------------------
def iter_buckets(named: Iterable[Named], bucket_mb: float = DEFAULT_BUCKET_MB
                 ) -> Iterator[list[Named]]:
    """Group tensors in order into buckets of at most ``bucket_mb`` MiB (a larger tensor gets a
    bucket of its own)."""
    if bucket_mb <= 0:
        raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
    limit = int(bucket_mb * (1 << 20))
    bucket: list[Named] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def weights_checksum(named: Iterable[Named] | Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over (name, dtype, shape, bytes) of every tensor, in name order.

    Equal checksums mean exactly the same weights under the same names.
    """
    items = named.items() if isinstance(named, Mapping) else named
    digest = hashlib.sha256()
    for name, tensor in sorted(items, key=lambda kv: kv[0]):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _flatten(bucket: Sequence[Named], device: torch.device) -> torch.Tensor:
    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for _, t in bucket]
    return torch.cat(parts).to(device) if parts else torch.empty(0, dtype=torch.uint8)


def _unflatten(buf: torch.Tensor, layout: Sequence[tuple[str, tuple[int, ...], torch.dtype]]
               ) -> list[Named]:
    out, offset = [], 0
    for name, shape, dtype in layout:
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        out.append((name, buf[offset:offset + nbytes].view(dtype).reshape(shape)))
        offset += nbytes
    if offset != buf.numel():
        raise RuntimeError(f"weight bucket holds {buf.numel()} bytes, layout says {offset}")
    return out


def engine_loader(engine: Any) -> Callable[[Iterable[Named]], Any]:
    """The blocking ``load_weights`` of an engine (``load_weights_sync`` when it has one, else
    ``load_weights``, awaited if it is a coroutine), or ``engine`` itself if it is callable."""
    fn = getattr(engine, "load_weights_sync", None) or getattr(engine, "load_weights", None)
    if fn is None:
        if callable(engine):
            fn = engine
        else:
            raise TypeError(f"{type(engine).__name__} has no load_weights(_sync) method")

    def load(weights: Iterable[Named]) -> Any:
        result = fn(weights)
        if inspect.isawaitable(result):
            return asyncio.run(result)  # type: ignore[arg-type]
        return result

    return load


# --- the dedicated process group --------------------------------------------------------------
class WeightSyncGroup:
    """A process group of its own between actor rank 0 (rank 0 here) and rollout workers.

    Built from a fresh TCP store and a gloo (CPU) or NCCL (GPU) group object, so it does not
    touch the default process group. All members construct it at the same time (it is a
    rendezvous), e.g. through two concurrent worker-group calls.
    """

    def __init__(self, master_addr: str, master_port: int, world_size: int, rank: int,
                 backend: str | None = None, timeout_s: float = 600.0,
                 device: torch.device | str | None = None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a sync group of {world_size}")
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
            else torch.device("cpu"))
        self.backend = backend or ("nccl" if self.device.type == "cuda" else "gloo")
        timeout = timedelta(seconds=timeout_s)
        self._store = dist.TCPStore(master_addr, int(master_port), world_size,
                                    is_master=rank == 0, timeout=timeout)
        if self.backend == "gloo":
            self._pg: Any = dist.ProcessGroupGloo(self._store, rank, world_size, timeout)
        elif self.backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self._pg = dist.ProcessGroupNCCL(self._store, rank, world_size, opts)
        else:
            raise ValueError(f"unknown backend {self.backend!r}; use 'gloo' or 'nccl'")

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """In-place broadcast of ``tensor`` from ``src``; returns it."""
        self._pg.broadcast(tensor, src).wait()
        return tensor

    def _broadcast_object(self, obj: Any = None) -> Any:
        """Pickle ``obj`` on rank 0 and broadcast it (length first, then bytes)."""
        data = None
        if self.rank == 0:
            data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size = torch.tensor([data.numel()], dtype=torch.long, device=self.device)
        else:
            size = torch.zeros(1, dtype=torch.long, device=self.device)
        n = int(self.broadcast(size).item())
        buf = data.to(self.device) if data is not None else torch.empty(
            n, dtype=torch.uint8, device=self.device)
        self.broadcast(buf)
        return obj if self.rank == 0 else pickle.loads(buf.cpu().numpy().tobytes())

    def send(self, named: Iterable[Named], version: int, bucket_mb: float) -> int:
        """Rank 0: broadcast the header and then every bucket. Returns the bytes sent."""
        if self.rank != 0:
            raise RuntimeError("only rank 0 of the sync group sends weights")
        buckets = list(iter_buckets(named, bucket_mb))
        layout = [[(n, tuple(t.shape), t.dtype) for n, t in b] for b in buckets]
        self._broadcast_object({"version": version, "buckets": layout})
        sent = 0
        for bucket in buckets:
            buf = _flatten(bucket, self.device)
            self.broadcast(buf)
            sent += buf.numel()
        return sent

    def receive(self, load: Callable[[Iterable[Named]], Any]) -> int:
        """Rollout side: receive one push and feed it to ``load`` (e.g. an engine's
        ``load_weights``) as an iterator of (name, tensor). Returns the policy version."""
        if self.rank == 0:
            raise RuntimeError("rank 0 of the sync group sends; the others receive")
        header = self._broadcast_object()
        layouts = header["buckets"]
        done = 0

        def stream() -> Iterator[Named]:
            nonlocal done
            while done < len(layouts):
                layout = layouts[done]
                nbytes = sum(torch.Size(s).numel() * torch.empty((), dtype=d).element_size()
                             for _, s, d in layout)
                buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                self.broadcast(buf)
                done += 1
                yield from _unflatten(buf, layout)

        load(stream())
        for _ in stream():  # stay in lockstep even if ``load`` stopped early
            pass
        return int(header["version"])

    def close(self) -> None:
        """Drop the group (the members should all close it)."""
        self._pg = None
        self._store = None  # type: ignore[assignment]


# --- colocated engines -----------------------------------------------------------------------
_LOCAL_ENGINES: list[Any] = []


def register_local_engine(engine: Any) -> None:
    """Make an engine living in this process a target of `WeightSync.push_local` (a rollout
    role colocated with actor rank 0 registers its engine here)."""
    if engine not in _LOCAL_ENGINES:
        _LOCAL_ENGINES.append(engine)


def unregister_local_engine(engine: Any) -> None:
    if engine in _LOCAL_ENGINES:
        _LOCAL_ENGINES.remove(engine)


def local_engines() -> list[Any]:
    """Engines registered in this process."""
    return list(_LOCAL_ENGINES)


# --- the actor side ---------------------------------------------------------------------------
class WeightSync:
    """Pushes an FSDP2 model's weights to inference engines; counts policy versions.

    Every actor rank holds one and calls the push methods together (the gather is a
    collective); rank 0 does the sending.
    """

    def __init__(self, model: nn.Module, bucket_mb: float = DEFAULT_BUCKET_MB,
                 version: int = 0) -> None:
        self.model = model
        self.bucket_mb = float(bucket_mb)
        self.version = int(version)
        self.group: WeightSyncGroup | None = None

    def gather(self) -> dict[str, torch.Tensor]:
        """The full weights under checkpoint names (tied ``lm_head.weight`` dropped) on rank 0;
        ``{}`` elsewhere. A collective."""
        return full_state_dict(self.model, skip_tied=True)

    def checksum(self) -> str | None:
        """`weights_checksum` of the gathered weights on rank 0 (None elsewhere)."""
        state = self.gather()
        return weights_checksum(state) if rank() == 0 else None

    def iter_full(self) -> Iterator[Named]:
        """Every rank: the full weights, gathered one bucket at a time (``DTensor.full_tensor``
        per parameter), so at most one bucket is unsharded beyond what the consumer keeps.
        A collective: every rank must exhaust it in step."""
        state = self.model.state_dict()
        if ties_embeddings(self.model):
            state.pop("lm_head.weight", None)
        for bucket in iter_buckets(state.items(), self.bucket_mb):
            for name, tensor in bucket:
                full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
                yield name, full.detach()

    def push_local(self, engines: Sequence[Any]) -> int:
        """Every actor rank pushes into the engines living in its own process (colocated
        rollout: one engine per rank, or only on rank 0; a rank without engines still takes
        part in the gather). Returns the new policy version.

        Raises when no rank has an engine: a colocated rollout role must register its engine
        with `register_local_engine`, or the push would silently update nothing.
        """
        if int(all_reduce(torch.tensor([len(engines)])).item()) == 0:
            raise RuntimeError(
                "push_local: no inference engine is registered in any actor process; a "
                "colocated rollout worker must call toolrl.workers.weights."
                "register_local_engine(engine) (or use the split-pool sync group)")
        stream = self.iter_full()
        if len(engines) == 1:
            engine_loader(engines[0])(stream)
        elif engines:
            full = list(stream)
            for engine in engines:
                engine_loader(engine)(iter(full))
        for _ in stream:  # keep the collective in step if a loader stopped early (or none)
            pass
        self.version += 1
        for engine in engines:  # samples are tagged with the actor's version
            engine.weight_version = self.version
        return self.version

    def connect(self, master_addr: str, master_port: int, world_size: int,
                backend: str | None = None, timeout_s: float = 600.0) -> None:
        """Rank 0 joins the sync group as its rank 0 (other actor ranks do nothing)."""
        if rank() == 0:
            self.group = WeightSyncGroup(master_addr, master_port, world_size, 0, backend,
                                         timeout_s)

    def push_group(self) -> int:
        """Broadcast the weights over the sync group; returns the new version."""
        state = self.gather()
        self.version += 1
        if rank() == 0:
            if self.group is None:
                raise RuntimeError("push_group before connect(): no weight sync group")
            self.group.send(state.items(), self.version, self.bucket_mb)
        return self.version


__all__ = [
    "DEFAULT_BUCKET_MB",
    "WeightSync",
    "WeightSyncGroup",
    "engine_loader",
    "iter_buckets",
    "local_engines",
    "register_local_engine",
    "unregister_local_engine",
    "weights_checksum",
]
