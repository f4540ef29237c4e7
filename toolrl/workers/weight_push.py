"""The actor's end of weight sync: `WeightSync` streams an FSDP2 model's full weights to the
rollout engines and counts policy versions.

Every push gathers the sharded parameters one at a time (``DTensor.full_tensor``, a collective
all actor ranks run in step) and hands them on at once, so no rank ever holds a full unsharded
copy. ``lm_head.weight`` is skipped when the embeddings are tied (the checkpoint, and so the
engine, does not have it). The routes (colocated engines, a broadcast group of split pools;
gloo on CPU, vLLM's NCCL weight transfer on GPU) and what both ends share are in
`toolrl.weights` (`colocated`, `group`, `nccl`, `buckets`); this module gathers the shards into
the stream those routes carry.

A LoRA actor (`toolrl.workers.lora`) pushes either the full weights with its adapter merged in
(``lora_sync="merge"``: same routes, the checkpoint's names) or only its adapter
(``"adapter"``: written in PEFT's format by every rank that hosts engines, and loaded by each
as a new LoRA version; colocated engines only).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from toolrl.weights.buckets import DEFAULT_BUCKET_MB, Checksum, Meta, Named
from toolrl.weights.colocated import engine_loader
from toolrl.weights.group import WeightSyncGroup, master_store
from toolrl.workers.fsdp import all_reduce, rank, ties_embeddings
from toolrl.workers.lora import is_adapter_name

if TYPE_CHECKING:
    from toolrl.workers.lora import LoraAdapter


class WeightSync:
    """Pushes an FSDP2 model's weights to inference engines; counts policy versions.

    Every actor rank holds one and calls the push methods together (the gathers are
    collectives); rank 0 does the sending.
    """

    def __init__(self, model: nn.Module, bucket_mb: float = DEFAULT_BUCKET_MB,
                 version: int = 0, lora: LoraAdapter | None = None,
                 lora_sync: str = "merge") -> None:
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
        self.model = model
        self.lora = lora
        self.adapter_only = lora is not None and lora_sync == "adapter"
        self._adapter_root: Path | None = None  # where adapter pushes are written
        self.bucket_mb = float(bucket_mb)
        self.version = int(version)
        self.group: WeightSyncGroup | None = None
        self._nccl: Any = None  # GPU split pools: vLLM's trainer-side NCCL communicator
        self._store: dist.TCPStore | None = None  # rank 0: the gloo route's held rendezvous
        self.wire_dtype: torch.dtype | None = None  # NCCL route: floats sent in this dtype

    def _state(self) -> dict[str, torch.Tensor]:
        state = self.model.state_dict()
        if ties_embeddings(self.model):
            state.pop("lm_head.weight", None)
        return state

    def metadata(self) -> list[Meta]:
        """(name, dtype, full shape) of every tensor a push sends, in order; no gather. The
        dtype is the one on the wire (`wire_dtype` for floating-point tensors when set)."""
        meta = [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape))
                for name, t in self._state().items()]
        meta = self.lora.merged_metadata(meta) if self.lora is not None else meta
        if self.wire_dtype is None:
            return meta
        wire = str(self.wire_dtype).removeprefix("torch.")
        return [(n, wire if getattr(torch, d).is_floating_point else d, shape)
                for n, d, shape in meta]

    def iter_push(self) -> Iterator[Named]:
        """What a full-weights push sends: `iter_full`, with a LoRA adapter merged in."""
        full = self.iter_full()
        return self.lora.merged(full) if self.lora is not None else full

    def iter_adapter(self) -> Iterator[Named]:
        """Every rank: the LoRA adapter's tensors, whole (a collective, like `iter_full`)."""
        for name, tensor in self._state().items():
            if is_adapter_name(name):
                full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
                yield name, full.detach()

    def iter_full(self) -> Iterator[Named]:
        """Every rank: the full weights under checkpoint names, gathered one tensor at a time
        (``DTensor.full_tensor``), so nothing beyond the tensor being handed on is unsharded.
        A collective: every rank must exhaust it in step."""
        for name, tensor in self._state().items():
            full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            yield name, full.detach()

    def checksum(self) -> str | None:
        """`weights_checksum` of the full weights on rank 0 (None elsewhere); a collective,
        streamed like a push."""
        acc = Checksum()
        for name, tensor in (self.iter_adapter() if self.adapter_only else self.iter_push()):
            if rank() == 0:
                acc.add(name, tensor)
        return acc.hexdigest() if rank() == 0 else None

    def push_local(self, engines: Sequence[Any]) -> int:
        """Every actor rank pushes into the engines living in its own process (colocated
        rollout: one engine per rank, or only on rank 0; a rank without engines still takes
        part in the gather). Returns the new policy version. Several engines in one process
        each get a pass of their own (gathered again), so memory stays bounded.

        Raises when no rank has an engine: a colocated rollout role must register its engine
        with `register_local_engine`, or the push would silently update nothing. An engine
        that raises mid-push fails the push on every rank (the same version everywhere), but
        only after its rank has run the rest of the gathers, so the other ranks do not wait out
        the collective's timeout (600 s).
        """
        counts = torch.tensor([len(engines), len(engines)], dtype=torch.long)
        total, most = (int(all_reduce(counts[:1]).item()),
                       int(all_reduce(counts[1:], dist.ReduceOp.MAX).item()))
        if total == 0:
            raise RuntimeError(
                "push_local: no inference engine is registered in any actor process; a "
                "colocated rollout worker must call toolrl.weights.colocated."
                "register_local_engine(engine) (or use the split-pool sync group)")
        if self.adapter_only:
            return self._push_adapter_local(engines)
        error: BaseException | None = None
        for i in range(most):
            stream = self.iter_push()
            if i < len(engines) and error is None:
                try:
                    engine_loader(engines[i])(stream)
                except Exception as e:  # drain first: the other ranks are in the gathers
                    error = e
            for _ in stream:  # keep the collective in step if a loader stopped early (or none)
                pass
        failed = all_reduce(torch.tensor([int(error is not None)]), dist.ReduceOp.MAX)
        if error is not None:
            raise error
        if int(failed.item()):
            raise RuntimeError("push_local: an engine of another actor rank failed the push "
                               "(its rank raised the error)")
        self.version += 1
        for engine in engines:  # samples are tagged with the actor's version
            engine.weight_version = self.version
        return self.version

    def _push_adapter_local(self, engines: Sequence[Any]) -> int:
        """Every rank gathers the adapter; each rank with engines writes it (PEFT format) and
        has them load it as LoRA version ``version`` (older versions' files are removed)."""
        assert self.lora is not None
        adapter = dict(self.iter_adapter())
        self.version += 1
        if engines:
            if self._adapter_root is None:
                self._adapter_root = Path(tempfile.mkdtemp(prefix="toolrl-adapter-"))
                weakref.finalize(self, shutil.rmtree, str(self._adapter_root), True)
            path = self.lora.save_adapter(adapter, self._adapter_root / f"v{self.version}")
            for engine in engines:
                engine.load_adapter_sync(str(path), self.version)
                engine.weight_version = self.version
            for old in self._adapter_root.iterdir():
                if old != path:
                    shutil.rmtree(old, ignore_errors=True)
        return self.version

    def reserve_port(self, host: str, timeout_s: float = 600.0) -> int:
        """Rank 0: the gloo route's rendezvous store, listening on ``host`` before its port is
        handed out (`master_store`); `connect` on that port joins through it."""
        self._store = master_store(host, timeout_s)
        return int(self._store.port)

    def connect(self, master_addr: str, master_port: int, world_size: int,
                backend: str | None = None, timeout_s: float = 600.0,
                wire_dtype: str | torch.dtype | None = None) -> None:
        """Rank 0 joins the sync group as its rank 0 (other actor ranks do nothing): a gloo
        `WeightSyncGroup`, or with ``backend="nccl"`` vLLM's trainer end of its NCCL weight
        transfer (the rollout engines join it with ``init_broadcast_receiver``). On the NCCL
        route ``wire_dtype`` (the engines' dtype, bf16 on GPU) is what floating-point weights
        travel in: the receivers allocate by the push's `metadata` and load into weights of
        that dtype anyway, so an fp32 actor sends half the bytes. The gloo route keeps the
        actor's dtype (its receivers can checksum what the actor holds)."""
        if backend == "nccl" and wire_dtype is not None:
            self.wire_dtype = wire_dtype if isinstance(wire_dtype, torch.dtype) else \
                getattr(torch, str(wire_dtype).removeprefix("torch."))
        if rank() != 0:
            return
        if backend == "nccl":
            # lazy: vLLM is optional and takes seconds to import
            from vllm.distributed.weight_transfer.nccl_common import trainer_init

            self._nccl = trainer_init({"master_address": master_addr,
                                       "master_port": int(master_port),
                                       "world_size": int(world_size)})
        else:
            store, self._store = self._store, None
            held = store is not None and int(store.port) == int(master_port)
            self.group = WeightSyncGroup(master_addr, master_port, world_size, 0, backend,
                                         timeout_s, store=store if held else None)

    def push_group(self) -> int:
        """Broadcast the weights over the sync group, bucket by bucket as they are gathered;
        returns the new version. Every actor rank calls it (the gathers are collectives)."""
        if self.adapter_only:
            raise RuntimeError("actor.lora.sync=adapter pushes into colocated engines only "
                               "(trainer.mode=sync); use actor.lora.sync=merge with split pools")
        self.version += 1
        stream = self.iter_push()
        if rank() == 0 and self._nccl is not None:
            # lazy: vLLM is optional and takes seconds to import
            from vllm.distributed.weight_transfer.packed_tensor import (
                DEFAULT_PACKED_NUM_BUFFERS,
                packed_nccl_broadcast_producer,
            )

            wire = self.wire_dtype
            packed_nccl_broadcast_producer(
                iterator=stream if wire is None else _cast_floats(stream, wire),
                group=self._nccl, src=0, post_iter_func=lambda item: item[1],
                buffer_size_bytes=int(self.bucket_mb * (1 << 20)),
                num_buffers=DEFAULT_PACKED_NUM_BUFFERS)
            torch.cuda.current_stream().synchronize()
        elif rank() == 0:
            if self.group is None:
                raise RuntimeError("push_group before connect(): no weight sync group")
            self.group.send(self.metadata(), stream, self.version, self.bucket_mb)
        for _ in stream:  # other ranks (and a short sender) stay in the gathers' step
            pass
        return self.version


def _cast_floats(stream: Iterator[Named], dtype: torch.dtype) -> Iterator[Named]:
    for name, tensor in stream:
        yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor


__all__ = ["WeightSync"]
