"""The broadcast route of split pools on CPU: `WeightSyncGroup`, a process group of its own
between actor rank 0 and the rollout workers (gloo, its own TCP store), independent of the
actors' FSDP group.

Rank 0 broadcasts a header (policy version, names, shapes, dtypes; the bucket layout follows
from them, `toolrl.weights.buckets.meta_buckets`) and then one flat byte buffer per bucket,
gathered just before it is sent; `WeightSyncGroup.receive_staged` on every rollout worker
receives each bucket straight into its engine's shared-memory staging file
(`toolrl.weights.staging.SharedMemoryPush.receive`) and has the engine load it. (On GPU the
split pools use vLLM's NCCL weight transfer instead: `toolrl.weights.nccl`.)
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from toolrl.weights.buckets import (
    Meta,
    Named,
    flatten_bucket,
    layout_bytes,
    meta_buckets,
    torch_dtype,
    unflatten_bucket,
)


def master_store(host: str, timeout_s: float = 600.0) -> dist.TCPStore:
    """A sync group's rendezvous store, listening from now on a port the OS picked (its
    ``port``): handed out only once it is held. A port found free and bound later can be taken
    in between, e.g. by the ephemeral ports of a gloo group's own connections (seen as
    ``EADDRINUSE`` on a 2-core machine)."""
    return dist.TCPStore(host, 0, None, True, timedelta(seconds=timeout_s),
                         wait_for_workers=False)


class WeightSyncGroup:
    """A process group of its own between actor rank 0 (rank 0 here) and rollout workers.

    Built from a fresh TCP store and a gloo group object (NCCL where a caller asks for it), so
    it does not touch the default process group. All members construct it at the same time (it
    is a rendezvous), e.g. through two concurrent worker-group calls.
    """

    def __init__(self, master_addr: str, master_port: int, world_size: int, rank: int,
                 backend: str | None = None, timeout_s: float = 600.0,
                 device: torch.device | str | None = None,
                 store: dist.TCPStore | None = None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a sync group of {world_size}")
        self.rank, self.world_size = rank, world_size
        self.backend = backend or "gloo"
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl"
            else torch.device("cpu"))
        timeout = timedelta(seconds=timeout_s)
        # rank 0 may bring the store it already listens on (`master_store`)
        self._store = store if store is not None else dist.TCPStore(
            master_addr, int(master_port), world_size, is_master=rank == 0, timeout=timeout)
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
            buf = flatten_bucket(bucket, self.device)
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
            typed = [(n, torch_dtype(d), tuple(s)) for n, d, s in layout]
            done = []

            def fill(buf: torch.Tensor, done: list[int] = done) -> None:
                self.broadcast(buf)
                done.append(1)

            receive(typed, fill)
            if not done:  # stay in lockstep with the sender even if ``receive`` skipped it
                nbytes = sum(layout_bytes(s, d) for _, d, s in typed)
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
                nbytes = sum(layout_bytes(s, torch_dtype(d)) for _, d, s in layout)
                buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                self.broadcast(buf)
                done += 1
                yield from unflatten_bucket(buf, layout)

        load(stream())
        for _ in stream():  # stay in lockstep even if ``load`` stopped early
            pass
        return int(header["version"])

    def close(self) -> None:
        """Drop the group (the members should all close it)."""
        self._pg = None
        self._store = None  # type: ignore[assignment]


__all__ = [
    "WeightSyncGroup",
]
