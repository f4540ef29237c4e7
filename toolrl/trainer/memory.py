"""Pre-flight memory plan: will this config fit the machine? Answered before any worker starts.

`plan_memory(cfg, shape)` estimates the peak of every process a run starts (the driver, Ray's
own processes, each worker process with the roles it hosts, each vLLM engine core) from the
model's shape and the config: weights, gradients, AdamW state, activations of one training
micro-batch in the layout `toolrl.workers.scoring` runs it (a prompt shared by a GRPO group runs
once; the LM head one chunk of positions at a time), the engine's weights and KV cache, and the
transients of a weight push (one bucket on each side). `check_memory` compares the plan with
the host memory per node (and the memory per GPU) and refuses a config that does not fit with
one line that says what to change (`MemoryBudgetError`, a `ConfigError`).

The plan is an upper bound in one respect: sequences are taken at their configured maximum
(`episode_lengths`: the first prompt at ``rollout.max_prompt_tokens``, the response the rest of
``rollout.max_total_tokens``, or one turn's ``max_tokens_per_turn`` in single-turn episodes),
while real episodes are usually shorter. The per-process base
costs (interpreter, torch, transformers, vLLM, Ray) are constants measured on the CPU machines
this project runs on; README and benchmarks/RESULTS.md compare the plan with measured peaks.

A model a process deletes and outlives (the driver's warm-start model, rank 0's unsharded copy
after sharding) is handed back to the OS (`toolrl.workers.host_memory.release_memory`), so the
plan counts it only while it lives; where the C library cannot trim (not glibc), the warm start's
weights and AdamW state are planned as resident in the driver for the whole run.

GPU runs: the engine holds ``gpu_memory_utilization`` of its GPU (weights, activations and KV
cache) unless it sleeps while the actor trains (``rollout.engine.sleep_level``: 1 offloads the
weights to host memory, 2 drops them), so the GPU plan takes the larger of the rollout phase
(actor state + engine) and the update phase (actor state + activations + what a sleeping engine
keeps).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from toolrl.models.source import locate_model
from toolrl.models.tiny import REAL_SHAPES, shape_config, tiny_config
from toolrl.trainer.config import (
    ConfigError,
    ExperimentConfig,
    resolve_model,
    worker_rollout_config,
)
from toolrl.workers.host_memory import can_trim

GiB = float(1 << 30)
MiB = float(1 << 20)

# Measured base costs (peak resident memory of a process running the tiny model, rounded up;
# benchmarks/bench_scale.py measures them).
DRIVER_BASE = 0.6 * GiB  # the driver: torch, transformers, Ray client, tokenizer, task rows
RAY_SYSTEM = 0.6 * GiB  # gcs, raylet and Ray's helper processes of a local cluster
WORKER_BASE = 0.8 * GiB  # a Ray worker with torch, transformers, vLLM's client imported
ENGINE_CORE_BASE = 0.8 * GiB  # vLLM's engine core (with its model worker in-process)
ENGINE_WORKER_BASE = 0.8 * GiB  # a separate vLLM worker process (engine multiprocessing)
FORK_SERVER_BASE = 0.35 * GiB  # the CPU engine's fork server: what it shares not with its core
CUDA_CONTEXT = 0.6 * GiB  # per process using a GPU
LOGITS_CHUNK_BYTES = 256 * MiB  # `toolrl.workers.scoring`'s default LM-head chunk
RAY_OOM_THRESHOLD = 0.95  # Ray's memory monitor kills workers above this share of RAM


class MemoryBudgetError(ConfigError):
    """The config cannot fit the machine's memory; the message says what to change."""


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on in a decoder-only transformer."""

    params: int
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    largest_layer_params: int  # the biggest single module vLLM reloads at once (the embedding)

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelShape:
        """From a transformers config; the parameter count from a model built on the meta
        device (no memory)."""
        text = getattr(config, "get_text_config", lambda: config)()
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        params = sum(p.numel() for p in model.parameters())
        heads = int(text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        embed = int(text.vocab_size) * int(text.hidden_size)
        return cls(params=int(params), vocab=int(text.vocab_size), hidden=int(text.hidden_size),
                   layers=int(text.num_hidden_layers), heads=heads,
                   kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
                   head_dim=head_dim, intermediate=int(text.intermediate_size),
                   tied=bool(getattr(text, "tie_word_embeddings", False)),
                   largest_layer_params=embed)

    def lora_params(self, rank: int, targets: Sequence[str]) -> int:
        """Parameters of rank-``rank`` LoRA adapters (A: rank x in, B: out x rank) on the
        projections named in ``targets``, in every layer (other names: hidden x hidden)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        dims = {"q_proj": (self.hidden, q), "k_proj": (self.hidden, kv),
                "v_proj": (self.hidden, kv), "o_proj": (q, self.hidden),
                "gate_proj": (self.hidden, self.intermediate),
                "up_proj": (self.hidden, self.intermediate),
                "down_proj": (self.intermediate, self.hidden)}
        per_layer = sum(rank * sum(dims.get(t, (self.hidden, self.hidden))) for t in targets)
        return per_layer * self.layers

    @property
    def root_params(self) -> int:
        """Parameters outside the decoder layers (embedding, untied lm_head, final norm): FSDP2
        keeps them unsharded for a whole forward and backward."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def layer_params(self) -> int:
        return (self.params - self.root_params) // max(self.layers, 1)

    def train_activation_bytes(self, tokens: int, dtype_bytes: int,
                               checkpointing: bool) -> float:
        """Activations autograd keeps for one micro-batch of ``tokens`` tokens.

        Per token and layer a Qwen2-style block keeps the two norm inputs and outputs, q/k/v
        and the attention output (k/v repeated to the query heads for SDPA), the o_proj input,
        and the MLP's gate, up, activation and product. With gradient checkpointing only
        each layer's input is kept, plus one layer recomputed in backward.
        """
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        per_layer = 4 * self.hidden + 6 * q + 2 * kv + 4 * self.intermediate
        if checkpointing:
            floats = tokens * (self.layers * self.hidden + per_layer)
        else:
            floats = tokens * self.layers * per_layer
        return float(floats * dtype_bytes)

    def forward_activation_bytes(self, tokens: int, dtype_bytes: int) -> float:
        """A no-grad forward: about two layers' intermediates alive at a time."""
        return float(tokens * (3 * self.hidden + 2 * self.intermediate) * dtype_bytes)


PHASES = ("rollout", "log-probs", "update", "optimizer step", "weight push")
TRAIN_PHASES = ("log-probs", "update", "optimizer step")


@dataclass
class ProcessPlan:
    """One kind of process: what it holds all along, what it adds in each phase of a step, and
    how many such processes run per node (or share a GPU)."""

    name: str
    count: int
    resident: dict[str, float] = field(default_factory=dict)
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    gpu: bool = False  # a plan of GPU memory rather than host memory
    pool: str = "train"  # GPUs of one pool are planned together (pipeline: rollout has its own)

    def add(self, phases: tuple[str, ...] | str, **items: float) -> None:
        for phase in (phases,) if isinstance(phases, str) else phases:
            self.phases.setdefault(phase, {}).update(items)

    def at(self, phase: str) -> dict[str, float]:
        """What it holds during ``phase``."""
        return {**self.resident, **self.phases.get(phase, {})}

    @property
    def peak(self) -> float:
        return max((sum(self.at(ph).values()) for ph in (*PHASES, *self.phases)),
                   default=sum(self.resident.values()))


@dataclass
class MemoryPlan:
    """Every process of a run, and the totals per node (host) and per GPU in each phase of a
    step (processes of one phase run at the same time; a warm start runs before the others)."""

    processes: list[ProcessPlan]
    host_budget: float | None
    gpu_budget: float | None
    notes: list[str] = field(default_factory=list)

    def _procs(self, gpu: bool, pool: str | None) -> list[ProcessPlan]:
        return [p for p in self.processes if p.gpu == gpu and (pool is None or p.pool == pool)]

    def phase_total(self, phase: str, gpu: bool = False, pool: str | None = None) -> float:
        """Host memory per node, or memory per GPU of ``pool`` (default: the busiest), in
        ``phase``."""
        if gpu and pool is None:
            return max((self.phase_total(phase, True, p) for p in self._pools()), default=0.0)
        procs = self._procs(gpu, pool if gpu else None)
        if phase not in PHASES:  # before the workers exist
            procs = [p for p in procs if phase in p.phases]
        return sum(sum(p.at(phase).values()) * p.count for p in procs)

    def _pools(self) -> list[str]:
        return sorted({p.pool for p in self.processes if p.gpu})

    def peak(self, gpu: bool = False) -> tuple[float, str]:
        """(total, phase) of the busiest phase (on GPU: of the busiest pool's GPUs)."""
        phases = {ph for p in self.processes for ph in p.phases} | set(PHASES)
        return max((self.phase_total(ph, gpu), ph) for ph in sorted(phases))

    @property
    def host_total(self) -> float:
        return self.peak(False)[0]

    @property
    def gpu_total(self) -> float:
        return self.peak(True)[0] if any(p.gpu for p in self.processes) else 0.0

    def fits(self) -> bool:
        host_ok = self.host_budget is None or self.host_total <= self.host_budget
        gpu_ok = self.gpu_budget is None or self.gpu_total <= self.gpu_budget
        return host_ok and gpu_ok

    def table(self, gpu: bool = False) -> list[tuple[str, int, float, str]]:
        """(process, count, GiB each, biggest items) in the busiest phase."""
        _, phase = self.peak(gpu)
        rows = []
        for p in self.processes:
            if p.gpu != gpu or (phase not in PHASES and phase not in p.phases):
                continue
            items = p.at(phase)
            top = sorted(items.items(), key=lambda kv: -kv[1])[:4]
            rows.append((p.name, p.count, sum(items.values()) / GiB,
                         ", ".join(f"{k} {v / GiB:.2f}" for k, v in top if v >= 0.01 * GiB)))
        return rows

    def summary(self) -> str:
        total, phase = self.peak(False)
        parts = [f"host {total / GiB:.1f} GiB at its peak ({phase})"
                 + (f" of {self.host_budget / GiB:.1f} usable" if self.host_budget else "")]
        if any(p.gpu for p in self.processes):
            gtotal, gphase = self.peak(True)
            parts.append(f"GPU {gtotal / GiB:.1f} GiB ({gphase})"
                         + (f" of {self.gpu_budget / GiB:.1f}" if self.gpu_budget else ""))
        return "memory plan: " + ", ".join(parts)


# --- the plan ---------------------------------------------------------------------------------
def _bytes(dtype: str | None) -> int:
    return 2 if str(dtype).lower() in ("bfloat16", "bf16", "float16", "fp16") else 4


def micro_batch_tokens(cfg: ExperimentConfig, forward_only: bool = False) -> tuple[int, int]:
    """(rows, tokens) of the largest micro-batch one actor rank runs, at the configured maximum
    lengths, in the layout `toolrl.workers.scoring` uses: a prompt shared by the rows of one
    GRPO group runs once (``shared_prefix``), unless gradient checkpointing, packing, or the
    varlen route (CUDA in half precision: ``auto`` packs there) make every row run whole."""
    a = cfg.actor
    ranks = cfg.resources.nodes * cfg.resources.processes_per_node
    group = cfg.algorithm.group_size
    local = math.ceil(cfg.data.batch_size * group / ranks)
    if a.ppo_mini_batch_size is not None:
        local = min(local, math.ceil(a.ppo_mini_batch_size / ranks))
    size = a.log_prob_micro_batch_size if forward_only and a.log_prob_micro_batch_size \
        else a.micro_batch_size
    rows = min(local, size) if size else local
    total = cfg.rollout.max_total_tokens
    prompt, response = episode_lengths(cfg)
    if a.max_tokens_per_micro_batch is not None:
        return rows, min(rows * total, max(a.max_tokens_per_micro_batch, total))
    varlen = cfg.resources.device == "cuda" and _bytes(a.param_dtype or a.dtype) == 2
    shared = a.share_prompts and not a.use_remove_padding and not varlen and \
        not (a.gradient_checkpointing and not forward_only)
    prompts = rows
    if shared:  # groups are consecutive rows; a micro-batch may straddle two of them
        aligned = rows % group == 0 or group % rows == 0
        prompts = min(rows, math.ceil(rows / group) + (0 if aligned else 1))
    return rows, prompts * prompt + rows * response


def episode_lengths(cfg: ExperimentConfig) -> tuple[int, int]:
    """(prompt, response) tokens of the longest episode the plan counts: the first prompt at
    its budget (``rollout.max_prompt_tokens``, as the rollout worker resolves it) and the rest
    of ``max_total_tokens``, or one turn's ``max_tokens_per_turn`` when episodes have one turn
    (a long-prompt single-turn config, such as tool schemas in the prompt, has short
    responses)."""
    ro = worker_rollout_config(cfg)
    prompt = min(ro.max_prompt_len, ro.max_total_tokens)
    response = ro.max_total_tokens - prompt
    if ro.max_turns == 1:
        response = min(response, ro.max_tokens_per_turn)
    return prompt, response


def _policy_state(shape: ModelShape, dtype: str, shards: int, trainable: bool,
                  adapters: int = 0) -> dict[str, float]:
    """What a policy holds between steps: its weights and, trained, AdamW's two moments
    (gradients are freed after each optimizer step). With LoRA ``adapters`` parameters are
    added to the frozen weights and only they are optimized."""
    b = _bytes(dtype)
    out = {"weights": (shape.params + adapters) * b / shards}
    if trainable:
        out["AdamW state"] = 2 * (adapters or shape.params) * b / shards
    return out


def _chunk_bytes(shape: ModelShape, fsdp: Any, tokens: int) -> float:
    chunk = getattr(fsdp, "logits_chunk_size", None)
    per_chunk = chunk * shape.vocab * 4 if chunk else LOGITS_CHUNK_BYTES
    return float(min(per_chunk, tokens * shape.vocab * 4))


def _unsharded(shape: ModelShape, fsdp: Any, layers: int) -> float:
    """FSDP2 gathers the root's parameters for a whole forward (and backward) and each layer's
    around its own compute (``layers`` of them at once)."""
    return float((shape.root_params + layers * shape.layer_params)
                 * _bytes(fsdp.param_dtype or fsdp.dtype))


def plan_memory(cfg: ExperimentConfig, shape: ModelShape, host_budget: float | None = None,
                gpu_budget: float | None = None) -> MemoryPlan:
    """The memory plan of ``cfg`` training a model of ``shape`` (see the module docstring)."""
    res = cfg.resources
    mode = cfg.trainer.mode
    engine = worker_rollout_config(cfg).engine  # as the trainer builds it (defaults resolved)
    gpu = res.device == "cuda"
    engine_gpu = engine.backend == "gpu"
    shards = res.nodes * res.processes_per_node  # FSDP ranks
    bucket = cfg.actor.weight_bucket_mb * MiB
    actor = cfg.actor
    # a LoRA actor trains only its adapters, and its reference is itself with them off
    lora = actor.lora
    adapters = shape.lora_params(lora.rank, lora.target_modules) if lora.enabled else 0
    with_ref = cfg.reference_worker
    with_critic = cfg.algorithm.name == "ppo"
    rows, train_tokens = micro_batch_tokens(cfg)
    _, fwd_tokens = micro_batch_tokens(cfg, forward_only=True)
    notes = [f"largest training micro-batch: {rows} rows, {train_tokens} tokens at the "
             f"configured maximum lengths (rollout.max_total_tokens="
             f"{cfg.rollout.max_total_tokens})"]

    # --- the trainer's processes: actor (+ ref, critic), with the rollout client colocated
    name = "worker: actor" + (" + ref" if with_ref else "") + \
        (" + critic" if with_critic else "") + (" + rollout" if mode == "sync" else "")
    host = ProcessPlan(name, count=res.processes_per_node)
    host.resident["process"] = WORKER_BASE
    dev = ProcessPlan(name, count=1, gpu=True) if gpu else host  # where the tensors live
    dev.resident.update({f"actor {k}": v for k, v in
                         _policy_state(shape, actor.dtype, shards, True, adapters).items()})
    if with_ref:
        dev.resident["ref weights"] = shape.params * _bytes(actor.dtype) / shards
    if with_critic:
        dev.resident.update({f"critic {k}": v for k, v in
                             _policy_state(shape, cfg.critic.dtype, shards, True).items()})
    compute = _bytes(actor.param_dtype or actor.dtype)
    grads = (adapters or shape.params) * _bytes(actor.dtype) / shards
    micro_batches = math.ceil(cfg.data.batch_size * cfg.algorithm.group_size
                              / shards / max(rows, 1))
    dev.add("update", **{
        "gradients": grads,
        "activations": shape.train_activation_bytes(train_tokens, compute,
                                                    actor.gradient_checkpointing),
        "LM-head chunks": 3 * _chunk_bytes(shape, actor, train_tokens),
        # dense vocab x hidden gradients: the lookup's and each head chunk's, before they are
        # added into the (tied) weight's gradient
        "embedding + LM-head gradient buffers": 0.0 if lora.enabled else
        2.0 * shape.vocab * shape.hidden * compute,
        "unsharded root + layers": _unsharded(shape, actor, 2),
        # accumulating into existing gradients: FSDP2's reduce-scatter in- and outputs
        "gradient accumulation": 2 * _unsharded(shape, actor, 1) if micro_batches > 1 else 0.0})
    dev.add("optimizer step", **{"gradients": grads, "AdamW temporaries": grads})
    dev.add("log-probs", **{
        "activations (no grad)": shape.forward_activation_bytes(fwd_tokens, compute),
        "LM-head chunks": 2 * _chunk_bytes(shape, actor, fwd_tokens),
        "unsharded root + layers": _unsharded(shape, actor, 1)})
    e_bytes = _bytes(engine.dtype)
    largest = shape.largest_layer_params * float(_bytes(actor.dtype))  # as gathered
    # tensors are staged in the engine's dtype; a bucket holds at least one of them
    staged = max(bucket, shape.largest_layer_params * float(e_bytes))
    if mode == "sync":  # colocated: the push runs in this process
        dev.add("weight push", **{"staging bucket": staged,
                                  "gathered tensor": largest if shards > 1 else 0.0})
    if gpu:
        dev.resident["CUDA context"] = CUDA_CONTEXT
        host.add("load", **{"checkpoint (rank 0 reads, broadcasts)":
                            shape.params * _bytes(actor.dtype) / res.processes_per_node})

    # --- the engines: the core process on the host, the weights there or on a GPU
    engine_weights = shape.params * e_bytes
    per_node = res.processes_per_node if mode == "sync" else res.rollout_processes_per_node
    core = ProcessPlan("vLLM engine core", count=per_node)
    core.resident["process"] = ENGINE_CORE_BASE
    holder = core
    if engine.multiprocessing:
        holder = ProcessPlan("vLLM worker", count=per_node)
        holder.resident["process"] = ENGINE_WORKER_BASE
    engine_procs = [core] + ([holder] if holder is not core else [])
    level = int(engine.sleep_level or 0) if mode == "sync" else 0
    if engine_gpu:
        eng = ProcessPlan("vLLM engine", count=1, gpu=True,
                          pool="train" if mode == "sync" else "rollout")
        eng.resident["CUDA context"] = CUDA_CONTEXT
        if gpu_budget is not None:
            held = {"weights + activations + KV cache":
                    float(engine.gpu_memory_utilization or 0.5) * gpu_budget}
        else:
            held = {"weights": float(engine_weights)}
            notes.append("GPU size unknown: set resources.gpu_memory_gib to plan the KV cache")
        if level:
            eng.add(("rollout", "weight push"), **held)
            notes.append(f"the engine sleeps (level {level}) while the actor trains")
            if level == 1:
                holder.add(TRAIN_PHASES, **{"offloaded engine weights": float(engine_weights)})
        else:
            eng.resident.update(held)
        engine_procs.append(eng)
    else:
        # `rollout.engine_guard`: the driver's, which the workers on its machine share; on
        # the other machines each worker starts its own
        server = ProcessPlan("vLLM fork server", count=1 if res.nodes == 1 else per_node)
        server.resident["process"] = FORK_SERVER_BASE
        engine_procs.append(server)
        holder.resident["weights"] = float(engine_weights)
        if shape.tied:
            holder.resident["packed lm_head (CPU GEMM)"] = float(shape.vocab * shape.hidden
                                                                 * e_bytes)
        holder.resident["KV cache"] = float(engine.kv_cache_gib or 0.0) * GiB
        holder.resident["sampler logits"] = 2.0 * 256 * shape.vocab * 4
        holder.add("weight push", **{
            "mapped bucket": max(bucket, shape.largest_layer_params * e_bytes),
            "reloaded layer + its CPU packing": 2 * shape.largest_layer_params * e_bytes})

    driver = ProcessPlan("driver", count=1)
    driver.resident["process"] = DRIVER_BASE
    if cfg.warm_start.enabled:  # supervised warm start in the driver, before workers start
        # a batch's transcripts are different tasks: only a common preamble runs once, so the
        # plan runs every row whole
        ws_tokens = cfg.warm_start.batch_size * sum(episode_lengths(cfg))
        driver.add("warm start", **{
            **{f"SFT {k}": v for k, v in _policy_state(shape, "float32", 1, True).items()},
            "SFT gradients": shape.params * 4.0,
            "SFT activations": shape.train_activation_bytes(ws_tokens, 4, False),
            "SFT LM-head chunks": 3 * _chunk_bytes(shape, actor, ws_tokens)})
        if not can_trim():  # freed, but the C library keeps the pages: the rest of the run too
            driver.resident["kept after the warm start (no malloc_trim)"] = \
                3.0 * shape.params * 4
            notes.append("this C library cannot hand freed memory back: the warm start's "
                         "weights and AdamW state stay resident in the driver")
    ray = ProcessPlan("Ray system processes", count=1)
    ray.resident["gcs, raylet, helpers"] = RAY_SYSTEM

    processes = [driver, ray]
    if mode != "sync":  # the rollout pool's own worker processes
        rollout = ProcessPlan("worker: rollout", count=res.rollout_processes_per_node)
        rollout.resident["process"] = WORKER_BASE
        if not engine_gpu:
            rollout.add("weight push", **{"staging bucket": staged})
        processes.append(rollout)
    processes.append(host)
    if gpu:
        processes.append(dev)
    processes.extend(engine_procs)
    return MemoryPlan(processes, host_budget, gpu_budget, notes)


# --- budgets and the check ----------------------------------------------------------------------
def host_budget(cfg: ExperimentConfig) -> float:
    """Host memory per node to plan with: ``resources.host_memory_gib`` or this machine's RAM,
    times Ray's out-of-memory threshold (its monitor kills workers above it)."""
    threshold = float(os.environ.get("RAY_memory_usage_threshold",  # noqa: SIM112 (Ray's name)
                                     RAY_OOM_THRESHOLD))
    if cfg.resources.host_memory_gib is not None:
        return cfg.resources.host_memory_gib * GiB * threshold

    return float(psutil.virtual_memory().total) * threshold


def gpu_budget(cfg: ExperimentConfig) -> float | None:
    """Memory per GPU: ``resources.gpu_memory_gib``, else the first visible GPU's, else None
    (unknown: a driver without a GPU planning a cluster's)."""
    if cfg.resources.gpu_memory_gib is not None:
        return cfg.resources.gpu_memory_gib * GiB
    if cfg.resources.device != "cuda" and cfg.rollout.engine.backend != "gpu":
        return None
    try:
        if torch.cuda.is_available():
            return float(torch.cuda.get_device_properties(0).total_memory)
    except Exception:
        return None
    return None


def model_shape(cfg: ExperimentConfig) -> ModelShape | None:
    """The shape of the model a run will train: the checkpoint's config.json, or the shape it
    will build (``model.tiny_size``), or a hub config when one can be read; None if unknown."""
    path = Path(cfg.model.path).expanduser()
    if (path / "config.json").is_file():
        return ModelShape.from_hf_config(AutoConfig.from_pretrained(path))
    source = locate_model(cfg.model.path, cfg.model.build_tiny_if_missing)
    if source.kind == "build" and not path.exists():
        size = cfg.model.tiny_size
        config = shape_config(size) if size in REAL_SHAPES else tiny_config(size)
        return ModelShape.from_hf_config(config)
    if source.kind != "hub":
        return None
    try:  # a cached hub id (or a reachable hub): never minutes of retries offline
        return ModelShape.from_hf_config(AutoConfig.from_pretrained(resolve_model(cfg)))
    except (ConfigError, OSError, ValueError):
        return None


def check_memory(cfg: ExperimentConfig, shape: ModelShape | None = None) -> MemoryPlan | None:
    """Plan ``cfg``'s memory and refuse (``resources.memory_check=refuse``) or warn when it does
    not fit. Returns the plan (None when the check is skipped or the model's shape is unknown)."""
    mode = cfg.resources.memory_check
    if mode == "skip":
        return None
    shape = shape or model_shape(cfg)
    if shape is None:
        return None
    plan = plan_memory(cfg, shape, host_budget(cfg), gpu_budget(cfg))
    if plan.fits():
        return plan
    message = explain(plan, cfg)
    if mode == "refuse":
        raise MemoryBudgetError(message + " (or resources.memory_check=warn to try anyway)")

    warnings.warn(message, stacklevel=2)
    return plan


def explain(plan: MemoryPlan, cfg: ExperimentConfig) -> str:
    """One line: what does not fit, the biggest consumer, and what to change."""
    gpu = plan.gpu_budget is not None and plan.gpu_total > plan.gpu_budget
    need, phase = plan.peak(gpu)
    have = plan.gpu_budget if gpu else plan.host_budget
    assert have is not None
    pool = max(plan._pools(), key=lambda q: plan.phase_total(phase, True, q)) if gpu else None
    items = {f"{p.name}: {k}": v * p.count for p in plan._procs(gpu, pool)
             for k, v in p.at(phase).items()
             if phase in PHASES or phase in p.phases}
    top = max(items, key=lambda k: items[k])
    where = "per GPU" if gpu else "of host memory per node"
    return (f"this config needs ~{need / GiB:.1f} GiB {where} ({phase}) but "
            f"{have / GiB:.1f} GiB are usable; largest: {top} {items[top] / GiB:.1f} GiB; "
            f"{_advice(top, cfg)}")


def _advice(item: str, cfg: ExperimentConfig) -> str:
    a = cfg.actor
    if "activations" in item or "LM-head" in item:
        rows, tokens = micro_batch_tokens(cfg)
        return (f"lower actor.micro_batch_size (now {rows} rows, {tokens} tokens), set "
                f"actor.gradient_checkpointing=true or shorten rollout.max_total_tokens")
    if "KV cache" in item:
        return "lower rollout.engine.kv_cache_gib (or gpu_memory_utilization)"
    if "weights + KV" in item:
        return ("lower rollout.engine.gpu_memory_utilization or let the engine sleep while "
                "the actor trains (rollout.engine.sleep_level=2, 1 with "
                "actor.lora.sync=adapter)")
    if "warm start" in item or "SFT" in item:
        return "lower warm_start.batch_size"
    if "bucket" in item:
        return "lower actor.weight_bucket_mb"
    if "process" in item or "gcs" in item:
        return "run fewer processes per node"
    shard = "add processes (FSDP shards the actor state)" if cfg.resources.device == "cuda" \
        else "use a machine with more memory or a smaller model"
    return (f"the model's state does not fit: {shard}, or train in bfloat16 "
            f"(actor.dtype={a.dtype})")


__all__ = [
    "MemoryBudgetError",
    "MemoryPlan",
    "ModelShape",
    "ProcessPlan",
    "check_memory",
    "episode_lengths",
    "explain",
    "gpu_budget",
    "host_budget",
    "micro_batch_tokens",
    "model_shape",
    "plan_memory",
]
