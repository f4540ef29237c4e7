"""The engine's end of every weight route: `EngineWeightRoutes`, new weights into a running
`toolrl.rollout.engine.VLLMEngine`.

Each engine builds one and hands itself to it (``engine.weights``); the routes reach the engine
only through its public surface (``llm``, ``call``, ``check_off_loop``, ``model_dtype``,
``weight_version`` / ``set_weight_version``). Every route ends the same way
(`EngineWeightRoutes._after_push`: the prefix cache reset, the weight version bumped, or set to
the trainer's, while generation is still held):

- `EngineWeightRoutes.load_weights_sync`: a full set of checkpoint-named weights, cast to the
  engine's dtype, one bucket of ``weight_bucket_mb`` at a time: shared-memory staging files on
  CPU (`toolrl.weights.staging.SharedMemoryPush`), vLLM's packed CUDA IPC transfer on GPU
  (`toolrl.weights.ipc.IpcPush`);
- ``init_broadcast_receiver`` / ``receive_broadcast``: GPU with split pools, vLLM's NCCL weight
  transfer (`toolrl.weights.nccl`; the trainer broadcasts, `toolrl.workers.weight_push`);
- ``load_adapter_sync``: a LoRA adapter served by vLLM's LoRA support (no base weights move);
- ``begin_staged_push`` / ``finish_staged_push``: CPU, a push whose buckets the caller fills (a
  rollout worker receiving the actor's broadcast over gloo, `toolrl.weights.group`);
- ``keep_inflight``: requests in flight are frozen for the push instead of refused (async mode).

The weight version is also vLLM's weight-version label (``AsyncLLM.update_weight_version``),
set while no request generates: the engine core stamps every step's outputs with it, so each
sampled token carries the version of the weights that sampled it, also across a push that lands
inside a request (`toolrl.rollout.engine.Completion.versions`).

How each route's bytes travel is `toolrl.weights.staging`, `toolrl.weights.ipc` and
`toolrl.weights.nccl`; this module is the engine's side of the session around them (names
checked, requests held, updates finished on error). `EngineError` lives here because the routes
raise it too; `toolrl.rollout.engine` re-exports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import weakref
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from toolrl.weights.ipc import IpcPush, ipc_buffer_bytes, largest_weight_numel
from toolrl.weights.nccl import nccl_receiver_init_info, nccl_update_info
from toolrl.weights.staging import SharedMemoryPush

BROADCAST_TIMEOUT_S = 600.0  # one engine call of an NCCL receive (the trainer's collectives')


class EngineError(RuntimeError):
    """The engine failed to start, died, or was used after shutdown."""


class EngineWeightRoutes:
    """The weight routes of one `VLLMEngine`, handed the engine (``engine.weights``).

    It drives the engine through the engine's public surface only: ``engine.llm`` (vLLM's
    ``AsyncLLM``), ``engine.call`` (a coroutine on the engine's loop, blocking),
    ``engine.check_off_loop``, ``engine.model_dtype`` and ``engine.set_weight_version``. What it
    keeps is its own: the adapter it serves (`lora_request`, which the engine's requests
    carry), whether vLLM's weight-transfer engine is initialised, a push that holds
    generation, the checkpoint's names, and the last push's diagnostics.
    """

    def __init__(self, engine: Any) -> None:
        # a weak reference: the engine owns its routes, and still shuts down when its last
        # user drops it (`VLLMEngine.__del__`), as it did before the routes were an object
        self.engine = weakref.proxy(engine)
        self.config = engine.config
        self.last_push_buckets = 0  # buckets of the last push (diagnostics, benchmarks)
        self.last_pause_s = 0.0  # how long the last keep_inflight push held generation
        self.lora_request: Any = None  # the LoRARequest every generate uses (adapter pushes)
        self._transfer_ready = False  # vLLM's weight-transfer engine initialised (GPU)
        self._paused_at: float | None = None  # a keep_inflight push is under way
        self._checkpoint_names, self._largest_weight_numel = _checkpoint_weights(
            self.config.model)
        self._tied = _ties_embeddings(self.config.model)

    @property
    def weight_version(self) -> int:
        """The engine's weight version (`VLLMEngine.weight_version`); a colocated push sets
        it to the actor's after loading (`toolrl.workers.weight_push.WeightSync.push_local`)."""
        return self.engine.weight_version

    @weight_version.setter
    def weight_version(self, version: int) -> None:
        self.engine.weight_version = version

    def load_weights_sync(self, weights: Iterable[tuple[str, torch.Tensor]] | Mapping[str, Any],
                          timeout: float | None = None) -> int:
        """Replace the model's weights in place (checkpoint names, e.g. an HF state dict), one
        bucket of ``weight_bucket_mb`` at a time; returns the new weight version.

        ``weights`` is consumed once, in the calling thread (it may be a generator that gathers
        sharded weights as it goes). The set must be exactly the checkpoint's weights
        (``lm_head.weight`` is dropped when the embeddings are tied): a list or mapping with a
        missing, unknown or repeated name is refused before anything is pushed; a stream that
        turns out incomplete raises `EngineError` after the push (the engine then holds a mix
        of old and new weights; push a complete set). No request may be in flight.
        ``timeout`` bounds each engine call.
        """
        self.engine.check_off_loop("load_weights_sync")
        if isinstance(weights, Mapping):
            weights = weights.items()
        names = _WeightNames(self._checkpoint_names, self._tied)
        if isinstance(weights, Collection):
            names.check_all(weights)  # before anything moves
        dtype = self.engine.model_dtype
        stream = ((name, _cast(t, dtype)) for name, t in names.filter(weights))
        self.engine.call(self._require_idle(), timeout)
        if self.config.backend == "gpu":
            self._push_ipc(stream, timeout)
        else:
            self._push_shared_memory(stream, timeout)
        try:
            names.check_complete()
        except ValueError as e:
            raise EngineError(f"{e}; the engine now holds a mix of old and new weights: push "
                              f"the complete set") from e
        return self._after_push(timeout)

    async def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]
                           | Mapping[str, Any]) -> int:
        """`load_weights_sync` from a coroutine (``weights`` is consumed in a worker thread)."""
        return await asyncio.to_thread(self.load_weights_sync, weights)

    def _push_shared_memory(self, stream: Iterable[tuple[str, torch.Tensor]],
                            timeout: float | None) -> None:
        push = SharedMemoryPush(lambda method, *args: self.engine.call(
            self._rpc(method, *args), timeout), self.config.weight_bucket_bytes)
        push.begin()
        try:
            push.push(stream)
        except BaseException as e:
            with contextlib.suppress(Exception):  # put back what can be put back
                push.finish()
            if push.buckets and isinstance(e, Exception):
                raise EngineError(f"weight push failed after {push.buckets} buckets ({e}); "
                                  f"the engine now holds a mix of old and new weights: push "
                                  f"the complete set") from e
            raise
        push.finish()
        self.last_push_buckets = push.buckets

    def _push_ipc(self, stream: Iterable[tuple[str, torch.Tensor]],
                  timeout: float | None) -> None:
        # lazy: vLLM is optional and takes seconds to import
        from vllm.distributed.weight_transfer.base import (
            WeightTransferInitRequest,
            WeightTransferUpdateRequest,
        )

        llm = self.engine.llm
        if not self._transfer_ready:
            self.engine.call(llm.init_weight_transfer_engine(
                WeightTransferInitRequest(init_info={"packed": True})), timeout)
            self._transfer_ready = True
        # a hub id has no local safetensors to read: the model's config gives the largest
        # tensor (IpcPush still grows its buffer for one that is larger)
        largest = self._largest_weight_numel or largest_weight_numel(
            llm.model_config.hf_config)
        push = IpcPush(
            start=lambda: self.engine.call(llm.start_weight_update(), timeout),
            update=lambda info: self.engine.call(llm.update_weights(
                WeightTransferUpdateRequest(update_info=info)), timeout),
            finish=lambda: self.engine.call(llm.finish_weight_update(), timeout),
            buffer_bytes=ipc_buffer_bytes(self.config.weight_bucket_bytes,
                                          largest * self.engine.model_dtype.itemsize))
        device = torch.device("cuda", torch.cuda.current_device())
        try:  # a failed push has finished the update session: the next push is served
            push.push((name, t.to(device, non_blocking=True)) for name, t in stream)
        except Exception as e:
            if push.buckets:
                raise EngineError(f"weight push failed after {push.buckets} buckets ({e}); the "
                                  f"engine now holds a mix of old and new weights: push the "
                                  f"complete set") from e
            raise
        self.last_push_buckets = push.buckets

    def init_broadcast_receiver(self, master_address: str, master_port: int, rank_offset: int,
                                world_size: int, timeout: float | None = None) -> None:
        """GPU, split pools: this engine's workers join the trainer's broadcast group (vLLM's
        NCCL weight transfer) as ranks ``rank_offset..``; a rendezvous, so call it while the
        trainer opens its end (`toolrl.workers.weight_push.WeightSync.connect`)."""
        # lazy: vLLM is optional and takes seconds to import
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self._require_gpu("init_broadcast_receiver", "nccl")
        info = nccl_receiver_init_info(master_address, master_port, rank_offset, world_size,
                                       self.config.weight_bucket_bytes)
        self.engine.call(self.engine.llm.init_weight_transfer_engine(
            WeightTransferInitRequest(init_info=info)), timeout)
        self._transfer_ready = True

    def receive_broadcast(self, metadata: Sequence[tuple[str, str, Sequence[int]]],
                          timeout: float | None = BROADCAST_TIMEOUT_S,
                          keep_inflight: bool = False, version: int | None = None) -> int:
        """GPU, split pools: receive one push of the trainer straight into vLLM's workers
        (``metadata``: name, dtype, shape of every tensor in send order); returns the new
        weight version (``version``, the trainer's, or the old one + 1). Runs while the trainer
        broadcasts. ``keep_inflight``: see
        `begin_staged_push`. ``timeout`` bounds each engine call (a trainer that died
        mid-broadcast is an `EngineError`, not a hang); a failed receive still finishes the
        engine's update session, so the next push is served."""
        # lazy: vLLM is optional and takes seconds to import
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        self._require_gpu("receive_broadcast", "nccl")
        if not self._transfer_ready:
            raise EngineError("receive_broadcast before init_broadcast_receiver")
        llm = self.engine.llm
        self._hold(keep_inflight, timeout)
        try:
            self.engine.call(llm.start_weight_update(), timeout)
            try:
                self.engine.call(llm.update_weights(WeightTransferUpdateRequest(
                    update_info=nccl_update_info(metadata))), timeout)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.engine.call(llm.finish_weight_update(), timeout)
                raise
            self.engine.call(llm.finish_weight_update(), timeout)
            return self._after_push(timeout, version)
        finally:
            self._release(timeout)

    def load_adapter_sync(self, path: str | os.PathLike, version: int,
                          timeout: float | None = None) -> int:
        """Serve a LoRA adapter (PEFT format in ``path``) from now on, as LoRA id ``version``
        (> 0; the policy version): vLLM loads it (`add_lora`), every later request uses it,
        the previous adapter is dropped and the prefix cache reset. Needs an engine built with
        ``max_lora_rank`` > 0; no request may be in flight. Returns ``version``."""
        self.engine.check_off_loop("load_adapter_sync")
        if not self.config.max_lora_rank:
            raise EngineError("load_adapter_sync: this engine was built without LoRA support "
                              "(EngineConfig.max_lora_rank=0); push merged weights instead")
        if int(version) < 1:
            raise ValueError(f"LoRA version must be >= 1, got {version}")
        self.engine.call(self._require_idle(), timeout)
        self.engine.call(self._swap_adapter(str(path), int(version)), timeout)
        return self._after_push(timeout, int(version))

    async def _swap_adapter(self, path: str, version: int) -> None:
        # lazy: vLLM is optional and takes seconds to import
        from vllm.lora.request import LoRARequest

        llm = self.engine.llm
        request = LoRARequest(f"toolrl-policy-v{version}", version, path, load_inplace=True)
        if not await llm.add_lora(request):
            raise EngineError(f"vLLM did not load the adapter in {path}")
        old, self.lora_request = self.lora_request, request
        if old is not None and old.lora_int_id != version:
            await llm.remove_lora(old.lora_int_id)

    def begin_staged_push(self, timeout: float | None = None,
                          keep_inflight: bool = False) -> SharedMemoryPush:
        """CPU: a push whose buckets the caller fills itself (e.g. receives into, over a
        broadcast group): ``bucket = push.stager...``; see `SharedMemoryPush`. Finish it with
        `finish_staged_push`. ``keep_inflight``: requests in flight are frozen for the push
        instead of refused (`pause_for_push`)."""
        if self.config.backend != "cpu":
            raise EngineError("staged pushes are the CPU route; on GPU use receive_broadcast")
        self.engine.check_off_loop("begin_staged_push")
        self._hold(keep_inflight, timeout)
        push = SharedMemoryPush(lambda method, *args: self.engine.call(
            self._rpc(method, *args), timeout), self.config.weight_bucket_bytes)
        try:
            push.begin()
        except BaseException:
            self._release(timeout)
            raise
        return push

    def finish_staged_push(self, push: SharedMemoryPush, timeout: float | None = None,
                           version: int | None = None) -> int:
        """Load the staged push; the new version is ``version`` (the trainer's) or the old one
        + 1, set before generation resumes."""
        try:
            push.finish()
            self.last_push_buckets = push.buckets
            return self._after_push(timeout, version)
        finally:
            self._release(timeout)

    def _after_push(self, timeout: float | None, version: int | None = None) -> int:
        # frozen requests lose their KV (computed by the old weights): vLLM preempts them and
        # recomputes it with the new weights when they resume
        reset = self.engine.llm.reset_prefix_cache(reset_running_requests=self._paused_at
                                                   is not None)
        if not self.engine.call(reset, timeout):
            raise EngineError("could not reset the prefix cache after the weight push")
        # before requests held by keep_inflight resume: their next tokens carry the new label
        new = self.engine.weight_version + 1 if version is None else int(version)
        self.engine.set_weight_version(new, timeout)
        return new

    # --- pushes while generating (trainer.mode=async) ---------------------------------------
    def _hold(self, keep_inflight: bool, timeout: float | None) -> None:
        """Before a push: refuse while requests are in flight, or (``keep_inflight``) freeze
        them with vLLM's ``pause_generation(mode="keep")``: the scheduler stops, every request
        keeps its tokens so far, new requests queue."""
        if not keep_inflight:
            self.engine.call(self._require_idle(), timeout)
            return
        self._paused_at = time.perf_counter()
        try:
            self.engine.call(self.engine.llm.pause_generation(mode="keep", clear_cache=False),
                       timeout)
        except BaseException:
            self._paused_at = None
            raise

    def _release(self, timeout: float | None) -> None:
        """After a push: resume a paused scheduler (frozen requests continue under the new
        weights; their tokens so far keep the log-probs they were sampled with)."""
        if self._paused_at is None:
            return
        try:
            self.engine.call(self.engine.llm.resume_generation(), timeout)
        finally:
            self.last_pause_s = time.perf_counter() - self._paused_at
            self._paused_at = None

    async def _require_idle(self) -> None:
        busy = self.engine.llm.get_num_unfinished_requests()
        if busy:
            raise EngineError(f"load_weights while {busy} requests are in flight; "
                              f"wait for the rollout to finish first")

    async def _rpc(self, method: str, *args: Any) -> list[Any]:
        return await self.engine.llm.collective_rpc(method, args=args)

    def _require_gpu(self, what: str, transfer: str) -> None:
        if self.config.backend != "gpu" or self.config.weight_transfer != transfer:
            raise EngineError(f"{what} needs backend='gpu' and weight_transfer={transfer!r} "
                              f"(got {self.config.backend!r}, {self.config.weight_transfer!r})")


class _WeightNames:
    """Checks the names of a push against the checkpoint's: none unknown, none twice, none
    missing; drops a tied ``lm_head.weight``."""

    def __init__(self, checkpoint: set[str] | None, tied: bool) -> None:
        self.checkpoint, self.tied = checkpoint, tied
        self.seen: set[str] = set()

    def check_all(self, weights: Collection[tuple[str, Any]]) -> None:
        for name, tensor in weights:
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"weight {name!r} is a {type(tensor).__name__}, not a tensor")
        kept = [n for n, _ in weights if not (self.tied and n == "lm_head.weight")]
        if not kept:
            raise ValueError("load_weights got no weights")
        twice = sorted({n for n in kept if kept.count(n) > 1})
        if twice:
            raise ValueError(f"weights given twice: {twice[:5]}")
        if self.checkpoint is not None:
            self._mismatch(set(kept))

    def filter(self, weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"weight {name!r} is a {type(tensor).__name__}, not a tensor")
            if self.tied and name == "lm_head.weight":
                continue
            if name in self.seen:
                raise ValueError(f"weight {name!r} given twice")
            if self.checkpoint is not None and name not in self.checkpoint:
                raise ValueError(f"load_weights needs exactly the checkpoint's weights; "
                                 f"unknown: [{name!r}]")
            self.seen.add(name)
            yield name, tensor

    def check_complete(self) -> None:
        if not self.seen:
            raise ValueError("load_weights got no weights")
        if self.checkpoint is not None:
            self._mismatch(self.seen)

    def _mismatch(self, names: set[str]) -> None:
        assert self.checkpoint is not None
        unknown = sorted(names - self.checkpoint)
        missing = sorted(self.checkpoint - names)
        if unknown or missing:
            raise ValueError(
                "load_weights needs exactly the checkpoint's weights; "
                f"unknown: {unknown[:5]}{'...' if len(unknown) > 5 else ''}, "
                f"missing: {missing[:5]}{'...' if len(missing) > 5 else ''}")


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Floating-point weights travel in the engine's dtype (it would cast them anyway)."""
    return tensor.to(dtype) if tensor.is_floating_point() and tensor.dtype != dtype else tensor


def _checkpoint_weights(model: str) -> tuple[set[str] | None, int]:
    """Tensor names in a local checkpoint's safetensors files (None when not local) and the
    element count of the largest one (0 when unknown)."""
    path = Path(model)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        return None, 0
    names: set[str] = set()
    largest = 0
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                names.add(key)
                sl = fh.get_slice(key)
                numel = 1
                for d in sl.get_shape():
                    numel *= int(d)
                largest = max(largest, numel)
    return names, largest


def _ties_embeddings(model: str) -> bool:
    cfg = Path(model) / "config.json"
    if cfg.is_file():
        return bool(json.loads(cfg.read_text()).get("tie_word_embeddings", False))
    return False


__all__ = ["BROADCAST_TIMEOUT_S", "EngineError", "EngineWeightRoutes"]
