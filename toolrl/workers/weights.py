"""The actor's end of weight sync: `WeightSync` streams an FSDP2 model's full weights to the
rollout engines and counts policy versions.

Every push gathers the sharded parameters one at a time (``DTensor.full_tensor``, a collective
all actor ranks run in step) and hands them on at once, so no rank ever holds a full unsharded
copy. ``lm_head.weight`` is skipped when the embeddings are tied (the checkpoint, and so the
engine, does not have it). The routes (colocated engines, a broadcast group of split pools;
gloo on CPU, vLLM's NCCL weight transfer on GPU) and what both ends share are in
`toolrl.sync.weights`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from toolrl.sync.weights import (
    DEFAULT_BUCKET_MB,
    Checksum,
    Meta,
    Named,
    WeightSyncGroup,
    engine_loader,
)
from toolrl.workers.fsdp import all_reduce, rank, ties_embeddings


class WeightSync:
    """Pushes an FSDP2 model's weights to inference engines; counts policy versions.

    Every actor rank holds one and calls the push methods together (the gathers are
    collectives); rank 0 does the sending.
    """

    def __init__(self, model: nn.Module, bucket_mb: float = DEFAULT_BUCKET_MB,
                 version: int = 0) -> None:
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
        self.model = model
        self.bucket_mb = float(bucket_mb)
        self.version = int(version)
        self.group: WeightSyncGroup | None = None
        self._nccl: Any = None  # GPU split pools: vLLM's trainer-side NCCL communicator

    def _state(self) -> dict[str, torch.Tensor]:
        state = self.model.state_dict()
        if ties_embeddings(self.model):
            state.pop("lm_head.weight", None)
        return state

    def metadata(self) -> list[Meta]:
        """(name, dtype, full shape) of every tensor a push sends, in order; no gather."""
        return [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape))
                for name, t in self._state().items()]

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
        for name, tensor in self.iter_full():
            if rank() == 0:
                acc.add(name, tensor)
        return acc.hexdigest() if rank() == 0 else None

    def push_local(self, engines: Sequence[Any]) -> int:
        """Every actor rank pushes into the engines living in its own process (colocated
        rollout: one engine per rank, or only on rank 0; a rank without engines still takes
        part in the gather). Returns the new policy version. Several engines in one process
        each get a pass of their own (gathered again), so memory stays bounded.

        Raises when no rank has an engine: a colocated rollout role must register its engine
        with `register_local_engine`, or the push would silently update nothing.
        """
        counts = torch.tensor([len(engines), len(engines)], dtype=torch.long)
        total, most = (int(all_reduce(counts[:1]).item()),
                       int(all_reduce(counts[1:], dist.ReduceOp.MAX).item()))
        if total == 0:
            raise RuntimeError(
                "push_local: no inference engine is registered in any actor process; a "
                "colocated rollout worker must call toolrl.sync.weights."
                "register_local_engine(engine) (or use the split-pool sync group)")
        for i in range(most):
            stream = self.iter_full()
            if i < len(engines):
                engine_loader(engines[i])(stream)
            for _ in stream:  # keep the collective in step if a loader stopped early (or none)
                pass
        self.version += 1
        for engine in engines:  # samples are tagged with the actor's version
            engine.weight_version = self.version
        return self.version

    def connect(self, master_addr: str, master_port: int, world_size: int,
                backend: str | None = None, timeout_s: float = 600.0) -> None:
        """Rank 0 joins the sync group as its rank 0 (other actor ranks do nothing): a gloo
        `WeightSyncGroup`, or with ``backend="nccl"`` vLLM's trainer end of its NCCL weight
        transfer (the rollout engines join it with ``init_broadcast_receiver``)."""
        if rank() != 0:
            return
        if backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_common import trainer_init

            self._nccl = trainer_init({"master_address": master_addr,
                                       "master_port": int(master_port),
                                       "world_size": int(world_size)})
        else:
            self.group = WeightSyncGroup(master_addr, master_port, world_size, 0, backend,
                                         timeout_s)

    def push_group(self) -> int:
        """Broadcast the weights over the sync group, bucket by bucket as they are gathered;
        returns the new version. Every actor rank calls it (the gathers are collectives)."""
        self.version += 1
        stream = self.iter_full()
        if rank() == 0 and self._nccl is not None:
            from vllm.distributed.weight_transfer.packed_tensor import (
                DEFAULT_PACKED_NUM_BUFFERS,
                packed_nccl_broadcast_producer,
            )

            packed_nccl_broadcast_producer(
                iterator=stream, group=self._nccl, src=0, post_iter_func=lambda item: item[1],
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


__all__ = ["WeightSync"]
