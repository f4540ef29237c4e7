"""The CPU route's bytes: weights staged in shared memory, one bucket at a time.

A push is a session in vLLM's worker, the same one vLLM's own weight-transfer engines run:
``initialize_layerwise_reload`` (begin), ``model.load_weights`` on each bucket (a layer is
re-processed, e.g. repacked for the CPU GEMM kernels, as soon as all its weights arrived), then
``finalize_layerwise_reload`` (finish); `toolrl.weights.vllm_worker.WeightLoaderExtension`
runs it inside vLLM's worker. On CPU (`SharedMemoryPush`) the caller copies each tensor into a
staging file in shared memory (``/dev/shm``), sends only the file's name and the layout through
``collective_rpc`` (a few hundred bytes of msgpack, whatever the bucket holds), and the worker
maps the file and loads views of it: no copy on the worker side and no byte string anywhere.
The caller unlinks each file once the worker has loaded it; a layer still waiting for weights
of the next bucket keeps its mapping alive until it is complete.

Only names, shapes and handles cross ``collective_rpc``, so its msgpack encoding (which refuses
single payloads over 4 GiB) never sees weight bytes. The GPU routes are `toolrl.weights.ipc`
(colocated) and `toolrl.weights.nccl` (split pools).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from toolrl.weights.buckets import Named

STAGING_PREFIX = "toolrl-weights-"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def staging_dir(bucket_bytes: int = 0) -> Path:
    """Where staging files go: ``/dev/shm`` (memory, shared with the engine's processes) when
    the machine has it with room for two buckets (containers often mount 64 MiB), else the temp
    dir (the page cache, which the engine maps just the same)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize >= 2 * bucket_bytes:
            return shm
    return Path(tempfile.gettempdir())


def remove_stale_staging(directory: Path | None = None) -> int:
    """Unlink staging files of processes that no longer exist (a push killed mid-way); returns
    how many were removed."""
    directory = directory or staging_dir()
    removed = 0
    for path in directory.glob(f"{STAGING_PREFIX}*"):
        pid = path.name.removeprefix(STAGING_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class StagedBucket:
    """One staging file: tensors laid end to end, and the layout the worker rebuilds them from.

    ``capacity`` bytes are mapped; space is reserved (``posix_fallocate``) region by region as
    tensors are added, so a full ``/dev/shm`` is an ``OSError`` here, not a SIGBUS on write.
    """

    path: Path
    capacity: int
    used: int = 0
    tensors: list[list[Any]] = field(default_factory=list)  # [name, dtype, shape, offset, n]
    _fd: int = -1
    _buf: torch.Tensor | None = None

    @classmethod
    def create(cls, directory: Path, capacity: int) -> StagedBucket:
        path = directory / f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(capacity, 1))
            buf = torch.from_file(str(path), shared=True, size=max(capacity, 1),
                                  dtype=torch.uint8)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return cls(path, capacity, _fd=fd, _buf=buf)

    def reserve(self, nbytes: int) -> torch.Tensor:
        """The next ``nbytes`` of the file as a writable uint8 tensor."""
        if self.used + nbytes > self.capacity:
            raise ValueError(f"staging bucket of {self.capacity} bytes cannot take {nbytes} "
                             f"more (holds {self.used})")
        assert self._buf is not None
        if nbytes:
            try:
                os.posix_fallocate(self._fd, self.used, nbytes)
            except OSError as e:
                raise OSError(e.errno, f"no room for {nbytes / 2**20:.0f} MiB of weights in "
                              f"{self.path.parent} (shared memory): {e.strerror}") from e
        view = self._buf[self.used:self.used + nbytes]
        return view

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Copy ``tensor`` in (as bytes) and record it."""
        t = tensor.detach()
        n = tensor_bytes(t)
        offset = self.used
        dst = self.reserve(n)
        if n:
            src = t.contiguous().reshape(-1).view(torch.uint8)
            dst.copy_(src.cpu() if src.device.type != "cpu" else src)
        self.record(name, t.dtype, tuple(t.shape), offset, n)

    def record(self, name: str, dtype: torch.dtype, shape: tuple[int, ...], offset: int,
               nbytes: int) -> None:
        if offset + nbytes > self.capacity:
            raise ValueError(f"tensor {name!r} ends at byte {offset + nbytes}, past the "
                             f"staging bucket's {self.capacity}")
        self.tensors.append([name, dtype_name(dtype), list(shape), offset, nbytes])
        self.used = max(self.used, offset + nbytes)

    def message(self) -> dict[str, Any]:
        """What travels through ``collective_rpc``: the file and the layout (plain data)."""
        return {"path": str(self.path), "size": max(self.used, 1), "tensors": self.tensors}

    def views(self) -> list[Named]:
        """The staged tensors as views of this side's mapping (e.g. to checksum them)."""
        assert self._buf is not None
        return staged_views(self._buf, self.tensors)

    def release(self) -> None:
        """Unmap, close and unlink (the worker's own mapping, if any, stays valid)."""
        self._buf = None
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)


class BucketStager:
    """Turns a stream of (name, tensor) into staging files of at most ``bucket_bytes`` each (a
    larger tensor gets a file of its own), copying each tensor in as it arrives, so the caller
    never holds more than the bucket being filled."""

    def __init__(self, bucket_bytes: int, directory: Path | None = None) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes")
        self.bucket_bytes = int(bucket_bytes)
        self.directory = directory or staging_dir(self.bucket_bytes)
        self._current: StagedBucket | None = None

    def add(self, name: str, tensor: torch.Tensor) -> StagedBucket | None:
        """Stage one tensor; returns the previous bucket when this one did not fit into it
        (send it, then `StagedBucket.release` it)."""
        n = tensor_bytes(tensor)
        full = None
        cur = self._current
        if cur is not None and cur.used + n > cur.capacity:
            full, self._current = cur, None
        if self._current is None:
            self._current = StagedBucket.create(self.directory, max(self.bucket_bytes, n))
        self._current.add(name, tensor)
        return full

    def flush(self) -> StagedBucket | None:
        """The last, partly filled bucket (None if nothing is staged)."""
        cur, self._current = self._current, None
        return cur if cur is not None and cur.tensors else _release(cur)

    def close(self) -> None:
        _release(self._current)
        self._current = None


def _release(bucket: StagedBucket | None) -> None:
    if bucket is not None:
        bucket.release()


def staged_views(buf: torch.Tensor, tensors: list[list[Any]]) -> list[Named]:
    out = []
    for name, dtype, shape, offset, nbytes in tensors:
        dt = getattr(torch, dtype)
        raw = buf[offset:offset + nbytes]
        out.append((name, raw.view(dt).view(shape) if nbytes else torch.empty(shape, dtype=dt)))
    return out


# --- the caller's side ------------------------------------------------------------------------
RPC = Callable[..., Any]  # blocking: rpc(method, *args) -> list of per-worker results


class SharedMemoryPush:
    """One CPU push: `begin`, `send` every bucket of a stream, `finish`.

    ``rpc`` runs a worker-extension method on every worker of the engine (blocking).
    """

    def __init__(self, rpc: RPC, bucket_bytes: int, directory: Path | None = None) -> None:
        self.rpc = rpc
        self.stager = BucketStager(bucket_bytes, directory)
        self.buckets = 0
        self.peak_bucket_bytes = 0

    def begin(self) -> None:
        remove_stale_staging(self.stager.directory)
        self.rpc("toolrl_begin_weight_update")

    def push(self, weights: Iterable[Named]) -> None:
        """Stage and load every tensor of ``weights`` (consumed in the caller's thread)."""
        try:
            for name, tensor in weights:
                full = self.stager.add(name, tensor)
                if full is not None:
                    self.send(full)
            last = self.stager.flush()
            if last is not None:
                self.send(last)
        finally:
            self.stager.close()

    def receive(self, layout: Iterable[tuple[str, torch.dtype, tuple[int, ...]]],
                fill: Callable[[torch.Tensor], Any],
                inspect: Callable[[list[Named]], Any] | None = None) -> None:
        """Stage one bucket of ``layout`` (names, dtypes, shapes laid end to end) whose bytes
        ``fill`` writes straight into the staging buffer (e.g. a broadcast receive), let
        ``inspect`` see the tensors (e.g. to checksum them), then load it."""
        entries = list(layout)
        sizes = [math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                 for _, dtype, shape in entries]
        bucket = StagedBucket.create(self.stager.directory, sum(sizes))
        try:
            fill(bucket.reserve(sum(sizes)))
            offset = 0
            for (name, dtype, shape), n in zip(entries, sizes, strict=True):
                bucket.record(name, dtype, tuple(shape), offset, n)
                offset += n
            if inspect is not None:
                inspect(bucket.views())
        except BaseException:
            bucket.release()
            raise
        self.send(bucket)

    def send(self, bucket: StagedBucket) -> None:
        """Have the workers load one staged bucket, then unlink it."""
        try:
            self.peak_bucket_bytes = max(self.peak_bucket_bytes, bucket.used)
            self.rpc("toolrl_load_weight_bucket", bucket.message())
            self.buckets += 1
        finally:
            bucket.release()

    def finish(self) -> int:
        return int(self.rpc("toolrl_finish_weight_update")[0])


def bucket_plan(named: Iterable[tuple[str, torch.dtype, tuple[int, ...]]], bucket_bytes: int
                ) -> list[list[str]]:
    """The names in each bucket `BucketStager` makes of a stream, from shapes and dtypes only
    (e.g. of meta tensors): for sizing and tests."""
    plan: list[list[str]] = []
    used = capacity = 0
    for name, dtype, shape in named:
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if not plan or used + n > capacity:
            plan.append([])
            used, capacity = 0, max(bucket_bytes, n)
        plan[-1].append(name)
        used += n
    return plan


__all__ = [
    "STAGING_PREFIX",
    "BucketStager",
    "SharedMemoryPush",
    "StagedBucket",
    "bucket_plan",
    "dtype_name",
    "remove_stale_staging",
    "staged_views",
    "staging_dir",
    "tensor_bytes",
]
