"""Weight sync, the part both ends share: buckets, checksums, the broadcast group, the
registry of engines living in this process.

A push streams the full weights bucket by bucket (``weight_bucket_mb``), so at most about one
bucket is in flight beyond the two models' own weights; the policy version goes up by one on
every push. Two routes, chosen by placement:

- colocated (each actor rank's process also hosts a rollout engine, or only rank 0's does):
  the rollout worker registers its engine here (`register_local_engine`) and the actor streams
  into each local engine's ``load_weights`` (`engine_loader`), which stages the stream bucket
  by bucket into its vLLM worker (`toolrl.rollout.weight_transfer`);
- split pools (rollout workers on their own devices): actor rank 0 and the rollout workers
  share a broadcast group of their own, independent of the actors' FSDP group.

  On CPU it is a gloo group (`WeightSyncGroup`: its own TCP store). Rank 0 broadcasts a header
  (policy version, names, shapes, dtypes; the bucket layout follows from them, `meta_buckets`)
  and then one flat byte buffer per bucket, gathered just before it is sent;
  `WeightSyncGroup.receive_staged` on every rollout worker receives each bucket straight into
  its engine's shared-memory staging file and has the engine load it.

  On GPU it is vLLM's NCCL weight transfer: vLLM's own worker is the receiving end, so the
  weights land on the engine's device without passing through the rollout worker's process.

The sending end, which gathers an FSDP2 model's shards, is `toolrl.workers.weights.WeightSync`;
the receiving end is the rollout worker and its engine. Both import this module; neither
imports the other.
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

Named = tuple[str, torch.Tensor]
Meta = tuple[str, str, tuple[int, ...]]  # name, dtype name, shape
DEFAULT_BUCKET_MB = 256.0


# --- buckets and checksums --------------------------------------------------------------------
def iter_buckets(named: Iterable[Named], bucket_mb: float = DEFAULT_BUCKET_MB
                 ) -> Iterator[list[Named]]:
    """Group tensors in order into buckets of at most ``bucket_mb`` MiB (a larger tensor gets a
    bucket of its own). Works on meta tensors (only shapes and dtypes are read)."""
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


class Checksum:
    """SHA-256 of a set of named tensors, fed one tensor at a time in any order (so a stream
    can be hashed without keeping it): the digest of the sorted (name, tensor digest) pairs,
    each tensor digest covering its dtype, shape and bytes."""

    def __init__(self) -> None:
        self._parts: dict[str, str] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        t = tensor.detach().to("cpu").contiguous()
        digest = hashlib.sha256(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        self._parts[name] = digest.hexdigest()

    def hexdigest(self) -> str:
        total = hashlib.sha256()
        for name in sorted(self._parts):
            total.update(f"{name}={self._parts[name]};".encode())
        return total.hexdigest()


def weights_checksum(named: Iterable[Named] | Mapping[str, torch.Tensor]) -> str:
    """`Checksum` of ``named``: equal checksums mean exactly the same weights under the same
    names (order does not matter)."""
    acc = Checksum()
    for name, tensor in (named.items() if isinstance(named, Mapping) else named):
        acc.add(name, tensor)
    return acc.hexdigest()


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    return torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()


def meta_buckets(meta: Sequence[Meta], bucket_mb: float) -> list[list[Meta]]:
    """`iter_buckets` over metadata alone (both ends of a broadcast cut the same buckets)."""
    probes = [(i, torch.empty(m[2], dtype=_dtype(m[1]), device="meta"))
              for i, m in enumerate(meta)]
    return [[meta[int(i)] for i, _ in bucket]
            for bucket in iter_buckets(((str(i), t) for i, t in probes), bucket_mb)]


def _flatten(bucket: Sequence[Named], device: torch.device) -> torch.Tensor:
    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for _, t in bucket]
    return torch.cat(parts).to(device) if parts else torch.empty(0, dtype=torch.uint8)


def _unflatten(buf: torch.Tensor, layout: Sequence[Meta]) -> list[Named]:
    out, offset = [], 0
    for name, dtype, shape in layout:
        nbytes = _nbytes(shape, _dtype(dtype))
        out.append((name, buf[offset:offset + nbytes].view(_dtype(dtype)).reshape(shape)))
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


# --- the dedicated process group (CPU: gloo) --------------------------------------------------
class WeightSyncGroup:
    """A process group of its own between actor rank 0 (rank 0 here) and rollout workers.

    Built from a fresh TCP store and a gloo group object (NCCL where a caller asks for it), so
    it does not touch the default process group. All members construct it at the same time (it
    is a rendezvous), e.g. through two concurrent worker-group calls.
    """

    def __init__(self, master_addr: str, master_port: int, world_size: int, rank: int,
                 backend: str | None = None, timeout_s: float = 600.0,
                 device: torch.device | str | None = None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a sync group of {world_size}")
        self.rank, self.world_size = rank, world_size
        self.backend = backend or "gloo"
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl"
            else torch.device("cpu"))
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

    def send(self, meta: Sequence[Meta], stream: Iterable[Named], version: int,
             bucket_mb: float) -> int:
        """Rank 0: broadcast the header (version, metadata, bucket size), then each bucket of
        ``stream`` (which must follow ``meta``) as soon as it is gathered. Returns bytes sent."""
        if self.rank != 0:
            raise RuntimeError("only rank 0 of the sync group sends weights")
        self._broadcast_object({"version": version, "meta": list(meta), "bucket_mb": bucket_mb})
        it = iter(stream)
        sent = 0
        for layout in meta_buckets(meta, bucket_mb):
            bucket = [next(it) for _ in layout]
            for (name, tensor), (want, dtype, shape) in zip(bucket, layout, strict=True):
                if name != want or str(tensor.dtype).removeprefix("torch.") != dtype or \
                        tuple(tensor.shape) != tuple(shape):
                    raise RuntimeError(f"weight stream gave {name!r} {tensor.dtype} "
                                       f"{tuple(tensor.shape)}, its metadata says {want!r} "
                                       f"{dtype} {tuple(shape)}")
            buf = _flatten(bucket, self.device)
            del bucket
            self.broadcast(buf)
            sent += buf.numel()
        return sent

    def receive_staged(self, receive: Callable[[list[tuple[str, torch.dtype, tuple[int, ...]]],
                                                Callable[[torch.Tensor], Any]], Any]) -> int:
        """Rollout side: receive one push bucket by bucket; for each, ``receive(layout, fill)``
        is called, and must call ``fill(buffer)`` with a uint8 tensor of the bucket's size for
        the broadcast to land in (e.g. an engine's staging file, `SharedMemoryPush.receive`).
        Returns the policy version."""
        if self.rank == 0:
            raise RuntimeError("rank 0 of the sync group sends; the others receive")
        header = self._broadcast_object()
        for layout in meta_buckets(header["meta"], header["bucket_mb"]):
            typed = [(n, _dtype(d), tuple(s)) for n, d, s in layout]
            done = []

            def fill(buf: torch.Tensor, done: list[int] = done) -> None:
                self.broadcast(buf)
                done.append(1)

            receive(typed, fill)
            if not done:  # stay in lockstep with the sender even if ``receive`` skipped it
                nbytes = sum(_nbytes(s, d) for _, d, s in typed)
                self.broadcast(torch.empty(nbytes, dtype=torch.uint8, device=self.device))
        return int(header["version"])

    def receive(self, load: Callable[[Iterable[Named]], Any]) -> int:
        """Rollout side: receive one push and feed it to ``load`` (e.g. an engine's
        ``load_weights``) as a stream of (name, tensor), one bucket in memory at a time.
        Returns the policy version."""
        if self.rank == 0:
            raise RuntimeError("rank 0 of the sync group sends; the others receive")
        header = self._broadcast_object()
        layouts = meta_buckets(header["meta"], header["bucket_mb"])
        done = 0

        def stream() -> Iterator[Named]:
            nonlocal done
            while done < len(layouts):
                layout = layouts[done]
                nbytes = sum(_nbytes(s, _dtype(d)) for _, d, s in layout)
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
    """Make an engine living in this process a target of a colocated push
    (`toolrl.workers.weights.WeightSync.push_local`; a rollout role colocated with an actor
    rank registers its engine here)."""
    if engine not in _LOCAL_ENGINES:
        _LOCAL_ENGINES.append(engine)


def unregister_local_engine(engine: Any) -> None:
    if engine in _LOCAL_ENGINES:
        _LOCAL_ENGINES.remove(engine)


def local_engines() -> list[Any]:
    """Engines registered in this process."""
    return list(_LOCAL_ENGINES)


__all__ = [
    "DEFAULT_BUCKET_MB",
    "Checksum",
    "WeightSyncGroup",
    "engine_loader",
    "iter_buckets",
    "local_engines",
    "meta_buckets",
    "register_local_engine",
    "unregister_local_engine",
    "weights_checksum",
]
