"""Weights into a running vLLM engine, one bucket at a time.

A push is a session in vLLM's worker, the same one vLLM's own weight-transfer engines run:
``initialize_layerwise_reload`` (begin), ``model.load_weights`` on each bucket (a layer is
re-processed, e.g. repacked for the CPU GEMM kernels, as soon as all its weights arrived), then
``finalize_layerwise_reload`` (finish). How a bucket's bytes travel depends on the backend:

- **CPU** (`SharedMemoryPush`): the caller copies each tensor into a staging file in shared
  memory (``/dev/shm``), sends only the file's name and the layout through ``collective_rpc``
  (a few hundred bytes of msgpack, whatever the bucket holds), and `WeightLoaderExtension`,
  mixed into vLLM's worker, maps the file and loads views of it: no copy on the worker side and
  no byte string anywhere. The caller unlinks each file once the worker has loaded it; a layer
  still waiting for weights of the next bucket keeps its mapping alive until it is complete.
  After the session the CPU-packed copy of every vocab embedding is rebuilt (vLLM's reload does
  not, and with tied embeddings the lm_head would keep the old weights: a silent log-prob error).
- **GPU, colocated** (`IpcPush`): vLLM's CUDA IPC weight-transfer engine in packed mode: one
  reusable device buffer of the bucket size, exported once; each bucket is copied into it and
  its handle sent (vLLM's ``packed_ipc_producer`` / ``IPCWeightTransferEngine``).
- **GPU, split pools**: vLLM's NCCL weight-transfer engine; the worker joins a broadcast group
  with the trainer (`nccl_receiver_init_info`) and receives packed buckets straight into the
  device (``NCCLWeightTransferEngine``); the trainer side lives in
  `toolrl.workers.weights`, what both ends share in `toolrl.sync.weights`.

Only names, shapes and handles cross ``collective_rpc``, so its msgpack encoding (which refuses
single payloads over 4 GiB) never sees weight bytes.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import math
import os
import pickle
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

Named = tuple[str, torch.Tensor]
STAGING_PREFIX = "toolrl-weights-"
_QUIET = "vllm.model_executor.model_loader.reload.layerwise"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


# --- shared-memory staging (the caller's side of a CPU push) ---------------------------------
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
        return _views(self._buf, self.tensors)

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


def _views(buf: torch.Tensor, tensors: list[list[Any]]) -> list[Named]:
    out = []
    for name, dtype, shape, offset, nbytes in tensors:
        dt = getattr(torch, dtype)
        raw = buf[offset:offset + nbytes]
        out.append((name, raw.view(dt).view(shape) if nbytes else torch.empty(shape, dtype=dt)))
    return out


# --- the worker side --------------------------------------------------------------------------
class WeightLoaderExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); runs in the worker process.

    ``toolrl_begin_weight_update`` / ``toolrl_load_weight_bucket`` (any number of times) /
    ``toolrl_finish_weight_update`` is one push.
    """

    def toolrl_begin_weight_update(self) -> None:
        # lazy: vLLM is optional and takes seconds to import
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            initialize_layerwise_reload(self._toolrl_model())
        self._toolrl_loaded = 0

    def toolrl_load_weight_bucket(self, bucket: dict[str, Any]) -> int:
        """Map a staging file and load its tensors (views of the mapping); returns how many."""
        # lazy: vLLM is optional and takes seconds to import
        from vllm.config import set_current_vllm_config

        buf = torch.from_file(bucket["path"], shared=False, size=int(bucket["size"]),
                              dtype=torch.uint8)
        weights = _views(buf, bucket["tensors"])
        del buf  # the views keep the mapping for as long as a layer still needs them
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            self._toolrl_model().load_weights(iter(weights))
        self._toolrl_loaded = getattr(self, "_toolrl_loaded", 0) + len(weights)
        return len(weights)

    def toolrl_finish_weight_update(self) -> int:
        """Process the layers still pending, restore the untouched ones, rebuild the CPU-packed
        vocab embeddings, drop caches built from the old weights; returns the tensors loaded."""
        # lazy: vLLM is optional and takes seconds to import
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self._toolrl_model()
        runner = self.model_runner  # type: ignore[attr-defined]
        with set_current_vllm_config(self.vllm_config), _quiet():  # type: ignore[attr-defined]
            # Layers without checkpoint weights (rotary, a tied lm_head) log "Failed to load
            # weights" here on every push: expected, so quieted.
            finalize_layerwise_reload(model, self.vllm_config.model_config)  # type: ignore[attr-defined]
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            fn = getattr(runner, reset, None)
            if fn is not None:
                fn()
        # vLLM's reload does not rebuild the CPU-packed GEMM copy of the (tied) lm_head.
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, VocabParallelEmbedding):
                    module.quant_method.process_weights_after_loading(module)
        return int(getattr(self, "_toolrl_loaded", 0))

    def toolrl_torch_threads(self) -> int:
        """The torch threads of this worker's forward pass (`EngineConfig.cpu_threads`)."""
        return torch.get_num_threads()

    def _toolrl_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()  # type: ignore[attr-defined]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    log = logging.getLogger(_QUIET)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


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


Producer = Callable[..., Iterator[Any]]  # vLLM's packed_ipc_producer(iterator, gpu_uuid, ...)


class IpcPush:
    """One GPU push through vLLM's CUDA IPC weight-transfer engine (packed: one device buffer of
    ``buffer_bytes``, reused for every bucket). ``start`` / ``update`` / ``finish`` are blocking
    wrappers of the engine's ``start_weight_update`` / ``update_weights`` /
    ``finish_weight_update``; ``producer`` is vLLM's ``packed_ipc_producer`` (or a stand-in
    with its signature, e.g. the GPU check's copy of it where vLLM is not installed), and
    ``device_uuid`` the GPU's UUID that keys the handles (None: the current device's).

    A tensor larger than the buffer (a hub-id model whose sizes could not be read up front:
    a Qwen2.5-7B embedding is 1.09 GB in bf16) ends the current export and a new buffer of its
    size carries it and the rest (``grown`` counts these); vLLM's producer would raise instead.
    A push that fails still finishes the engine's update session, so the next push is not
    refused as "already active"; the error is raised.
    """

    def __init__(self, start: Callable[[], Any], update: Callable[[dict[str, Any]], Any],
                 finish: Callable[[], Any], buffer_bytes: int,
                 producer: Producer | None = None, device_uuid: str | None = None) -> None:
        self.start, self.update, self.finish_fn = start, update, finish
        self.buffer_bytes = int(buffer_bytes)
        self.producer, self.device_uuid = producer, device_uuid
        self.buckets = 0
        self.grown = 0

    def push(self, weights: Iterable[Named]) -> None:
        producer = self.producer
        if producer is None:
            # lazy: vLLM is optional and takes seconds to import
            from vllm.distributed.weight_transfer.packed_tensor import packed_ipc_producer

            producer = packed_ipc_producer
        uuid_ = self.device_uuid or str(
            torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        stream = _Segments(iter(weights), self.buffer_bytes)
        self.start()
        try:
            while not stream.done:
                for chunk in producer(stream.segment(), uuid_, post_iter_func=lambda it: it[1],
                                      buffer_size_bytes=stream.buffer_bytes):
                    # pickled: the handle holds torch types that plain msgpack cannot carry
                    handles = base64.b64encode(pickle.dumps(chunk.ipc_handle)).decode()
                    self.update({"names": chunk.names, "dtype_names": chunk.dtype_names,
                                 "shapes": chunk.shapes, "tensor_sizes": chunk.tensor_sizes,
                                 "ipc_handles_pickled": handles})
                    self.buckets += 1
        except BaseException:
            with contextlib.suppress(Exception):  # end the session: later pushes are served
                self.finish_fn()
            raise
        finally:
            self.buffer_bytes, self.grown = stream.buffer_bytes, stream.grown
        self.finish_fn()
        if torch.cuda.is_initialized():
            torch.cuda.ipc_collect()


class _Segments:
    """A weight stream cut where a tensor outgrows the buffer: each `segment` runs until such a
    tensor, which opens the next segment with a buffer of its size."""

    def __init__(self, weights: Iterator[Named], buffer_bytes: int) -> None:
        self.weights, self.buffer_bytes = weights, max(int(buffer_bytes), 1)
        self.pending: Named | None = None
        self.done = False
        self.grown = 0

    def segment(self) -> Iterator[Named]:
        if self.pending is not None:
            item, self.pending = self.pending, None
            yield item
        for item in self.weights:
            n = tensor_bytes(item[1])
            if n > self.buffer_bytes:
                self.pending, self.buffer_bytes = item, n
                self.grown += 1
                return
            yield item
        self.done = True


def ipc_bucket_sizes(sizes: Iterable[int], buffer_bytes: int) -> list[int]:
    """Bytes in each bucket of a packed IPC push of tensors of ``sizes`` (bytes, in order)
    through a buffer of ``buffer_bytes``, as `IpcPush` with vLLM's producer cuts them: a
    bucket fills to capacity, and a tensor larger than the buffer grows it."""
    buckets: list[int] = []
    capacity, used = max(int(buffer_bytes), 1), 0
    for n in sizes:
        if n > capacity:  # a new export of a larger buffer
            if used:
                buckets.append(used)
            capacity, used = n, 0
        elif used and used + n > capacity:
            buckets.append(used)
            used = 0
        used += n
    if used:
        buckets.append(used)
    return buckets


def nccl_receiver_init_info(master_address: str, master_port: int, rank_offset: int,
                            world_size: int, buffer_bytes: int) -> dict[str, Any]:
    """``init_info`` of vLLM's NCCL weight-transfer engine for a rollout engine whose workers
    take ranks ``rank_offset..`` of a broadcast group with the trainer (rank 0)."""
    return {"master_address": master_address, "master_port": int(master_port),
            "rank_offset": int(rank_offset), "world_size": int(world_size), "packed": True,
            "packed_buffer_size_bytes": int(buffer_bytes), "packed_num_buffers": 2}


def nccl_update_info(metadata: Iterable[tuple[str, str, tuple[int, ...]]]) -> dict[str, Any]:
    """``update_info`` of one NCCL push: names, dtypes and shapes in the trainer's send order
    (both sides cut the packed buckets from it)."""
    meta = list(metadata)
    return {"names": [m[0] for m in meta], "dtype_names": [m[1] for m in meta],
            "shapes": [list(m[2]) for m in meta]}


def largest_weight_numel(config: Any) -> int:
    """Elements of the largest weight a decoder LM of this (Hugging Face) config has: the
    vocab embedding / LM head, an MLP or an attention projection. For a model given as a hub
    id, whose safetensors cannot be read up front (a Qwen2.5-0.5B embedding is 272 MB in bf16,
    over the default 256 MiB bucket)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    head_dim = int(getattr(text, "head_dim", 0) or 0) or hidden // max(heads, 1)
    mlp = max(int(getattr(text, key, 0) or 0) for key in
              ("intermediate_size", "moe_intermediate_size", "ffn_dim"))
    vocab = int(getattr(text, "vocab_size", 0) or 0)
    return max(vocab * hidden, mlp * hidden, heads * head_dim * hidden)


def ipc_buffer_bytes(bucket_bytes: int, largest_tensor_bytes: int) -> int:
    """The IPC buffer holds a whole bucket and at least the largest tensor."""
    return int(max(bucket_bytes, largest_tensor_bytes, 1))


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
    "BucketStager",
    "IpcPush",
    "SharedMemoryPush",
    "StagedBucket",
    "WeightLoaderExtension",
    "bucket_plan",
    "ipc_bucket_sizes",
    "ipc_buffer_bytes",
    "largest_weight_numel",
    "nccl_receiver_init_info",
    "nccl_update_info",
    "remove_stale_staging",
    "staging_dir",
]
