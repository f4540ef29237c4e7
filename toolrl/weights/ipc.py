"""The colocated GPU route's bytes: vLLM's CUDA IPC weight-transfer engine in packed mode.

One reusable device buffer of the bucket size, exported once; each bucket is copied into it and
its handle sent (vLLM's ``packed_ipc_producer`` / ``IPCWeightTransferEngine``). `IpcPush` runs
one push; `ipc_buffer_bytes` and `largest_weight_numel` size the buffer, `ipc_bucket_sizes`
predicts the buckets.
"""

from __future__ import annotations

import base64
import contextlib
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from toolrl.weights.buckets import Named
from toolrl.weights.staging import tensor_bytes

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


__all__ = [
    "IpcPush",
    "ipc_bucket_sizes",
    "ipc_buffer_bytes",
    "largest_weight_numel",
]
