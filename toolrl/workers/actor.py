"""The FSDP2 policy: actor (trained) and reference (frozen), plain classes and Ray workers.

`FSDPActor` computes log-probs of response tokens and runs the PPO update (`toolrl.algo.loss.
actor_loss`: any registered policy loss, entropy bonus, KL-to-reference term);
`FSDPReference` is the same model frozen (no optimizer) giving ``ref_log_probs``. Both work in
a plain process (a world of one) or inside a worker group.

`ActorWorker` and `RefWorker` wrap them for the single controller::

    actor = RayWorkerGroup(pool, {"actor": RoleSpec.of(ActorWorker, cfg),
                                  "ref": RoleSpec.of(RefWorker, cfg)})   # colocated
    td.update(actor.role("actor").call(ActorWorker.compute_log_prob, td))
    metrics = actor.role("actor").call(ActorWorker.update, td)[0]

Log-probs: the logits at positions ``P-1 .. P+R-2`` predict the ``R`` response tokens; they
are divided by ``temperature`` first, so they match the distribution the rollout sampled from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict

from toolrl.algo.loss import LossAggregator, PolicyLossConfig, actor_loss
from toolrl.batch import (
    ADVANTAGES,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    RESPONSE_MASK,
    ROLLOUT_LOG_PROBS,
)
from toolrl.controller.network import free_port
from toolrl.controller.worker import Dispatch, Execute, Worker, remote
from toolrl.weights.buckets import DEFAULT_BUCKET_MB
from toolrl.weights.colocated import local_engines
from toolrl.workers.base import FSDPConfig, FSDPModel, LossTotals
from toolrl.workers.lora import LoraAdapter, LoraConfig, lora_config
from toolrl.workers.scoring import enable_scoring, prompt_groups, score_responses
from toolrl.workers.weight_push import WeightSync

ENTROPY = "entropy"  # [B, R] policy entropy per response token (diagnostics)


@dataclass(frozen=True)
class ActorConfig(FSDPConfig):
    """The actor (and reference): `FSDPConfig` plus the policy loss.

    Attributes:
        temperature: sampling temperature of the rollout; logits are divided by it (in an
            experiment the trainer sets it from ``rollout.temperature``).
        loss: the policy loss and its hyper-parameters (`toolrl.algo.loss.PolicyLossConfig`:
            ``policy_loss`` name, clip ratios, dual-clip, off-policy corrections, aggregation,
            entropy and KL coefficients).
        max_response_length: the response budget, needed by the ``seq-mean-token-sum-norm``
            aggregation (Dr.GRPO); in an experiment the trainer sets it from
            ``rollout.max_total_tokens``.
        weight_bucket_mb: bucket size of weight pushes to the rollout engines.
        share_prompts: score in the ``auto`` layout (`toolrl.workers.scoring`): on CUDA in
            half precision every row's real tokens packed into one row on torch's varlen
            kernel (the fastest there, benchmarks/gpu_check.md); elsewhere rows with identical
            prompts (a GRPO group) run the prompt once and the responses on its KV cache (not
            under gradient checkpointing). Off: every row runs whole (``padded``);
            ``use_remove_padding`` packs either way.
        logits_chunk_size: response positions per LM-head chunk (None: as many as fit in
            256 MiB of float32 logits); the ``[tokens x vocab]`` logits never exist whole.
        lora: train LoRA adapters (`toolrl.workers.lora.LoraConfig`; ``rank: 0``, the
            default, trains the full weights). The reference is then the actor with its adapter
            off (`FSDPActor.compute_ref_log_prob`), not a second model.
    """

    lr: float = 1e-6
    temperature: float = 1.0
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    max_response_length: int | None = None
    weight_bucket_mb: float = DEFAULT_BUCKET_MB
    share_prompts: bool = True
    logits_chunk_size: int | None = None
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "lora", lora_config(self.lora))
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if isinstance(self.loss, dict):  # e.g. built from a plain mapping
            object.__setattr__(self, "loss", PolicyLossConfig(**self.loss))
        if self.logits_chunk_size is not None and self.logits_chunk_size < 1:
            raise ValueError(f"logits_chunk_size must be >= 1 or None, got "
                             f"{self.logits_chunk_size}")

    @property
    def on_policy(self) -> bool:
        """One optimizer step per batch and no off-policy correction: the log-probs before the
        update are those of the update's own forward, so a batch needs no separate
        ``old_log_probs`` pass (TRL and verl skip it too)."""
        return self.ppo_epochs == 1 and self.ppo_mini_batch_size is None and \
            not self.loss.corrections

    @property
    def forward_layout(self) -> str:
        """How `toolrl.workers.scoring` runs the trunk (see its `LAYOUTS`)."""
        if self.use_remove_padding:
            return "packed"
        return "auto" if self.share_prompts else "padded"


class FSDPPolicy(FSDPModel):
    """A causal LM sharded with FSDP2 that scores response tokens."""

    config: ActorConfig

    def __init__(self, config: ActorConfig, trainable: bool,
                 model_kwargs: dict[str, Any] | None = None) -> None:
        # LoRA wraps the trained actor only (a separate reference is the plain base model)
        self.lora = LoraAdapter(config.lora, seed=config.seed) \
            if config.lora.enabled and trainable else None
        super().__init__(config, trainable=trainable, model_kwargs=model_kwargs,
                         prepare=self.lora.apply if self.lora is not None else None)
        enable_scoring(self.model)

    def _log_probs(self, td: TensorDict, with_entropy: bool, entropy_grad: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[b, R]`` log-probs (and entropies) of ``td``'s response tokens; 0 on padding."""
        return score_responses(self.model, td, temperature=self.config.temperature,
                               with_entropy=with_entropy, entropy_grad=entropy_grad,
                               layout=self.config.forward_layout,
                               chunk_size=self.config.logits_chunk_size)

    def _micro_units(self, td: TensorDict) -> torch.Tensor | None:
        """Token-budget micro-batches keep rows of one prompt together (they share its run)."""
        return prompt_groups(td) if self.config.forward_layout == "auto" else None

    def log_probs(self, td: TensorDict, key: str, with_entropy: bool = False) -> TensorDict:
        """Log-probs of every response token under ``key`` (``[B, R]``, rows in ``td``'s order),
        plus ``entropy`` when asked."""

        def fn(micro: TensorDict) -> dict[str, torch.Tensor]:
            lp, ent = self._log_probs(micro, with_entropy)
            return {key: lp} if ent is None else {key: lp, ENTROPY: ent}

        return self.forward_batches(td, fn)


class FSDPActor(FSDPPolicy):
    """The trained policy: `compute_log_prob` and the PPO `update`."""

    metric_prefix = "actor"

    def __init__(self, config: ActorConfig, model_kwargs: dict[str, Any] | None = None
                 ) -> None:
        super().__init__(config, trainable=True, model_kwargs=model_kwargs)
        self.weights = WeightSync(self.model, config.weight_bucket_mb, lora=self.lora,
                                  lora_sync=config.lora.sync)

    def compute_log_prob(self, td: TensorDict, with_entropy: bool = False) -> TensorDict:
        """``old_log_probs [B, R]`` (and ``entropy``) of ``td``'s responses."""
        return self.log_probs(td, OLD_LOG_PROBS, with_entropy)

    def compute_ref_log_prob(self, td: TensorDict) -> TensorDict:
        """``ref_log_probs [B, R]``: a LoRA actor's base model (its adapter off); without
        LoRA the actor has no reference of its own (use `FSDPReference`)."""
        if self.lora is None:
            raise RuntimeError("compute_ref_log_prob on a full fine-tuning actor: its "
                               "reference is a separate FSDPReference (RefWorker)")
        with self.lora.disabled():
            return self.log_probs(td, REF_LOG_PROBS)

    def export_hf(self, path: str | os.PathLike, merged: bool = False) -> Path | None:
        """Without LoRA: the full model (`FSDPModel.export_hf`). With LoRA: the adapter in
        PEFT's format, or with ``merged`` the full model with the adapter merged in."""
        if self.lora is None:
            return super().export_hf(path)
        stream = self.lora.merged(self.weights.iter_full()) if merged else \
            self.weights.iter_adapter()
        state = {name: t for name, t in stream if self.rank == 0}  # every rank gathers
        if merged:
            return self._write_hf(state, path)
        out = Path(path)
        if self.rank == 0:
            self.lora.save_adapter(state, out)
        if dist.is_initialized():
            dist.barrier()
        return out if self.rank == 0 else None

    def _micro_loss(self, micro: TensorDict, totals: LossTotals
                    ) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config.loss
        agg = LossAggregator(cfg.loss_agg_mode, total_tokens=totals.tokens,
                             total_seqs=totals.seqs, max_len=self.config.max_response_length)
        log_probs, entropy = self._log_probs(micro, with_entropy=True,
                                             entropy_grad=cfg.entropy_coeff != 0.0)
        if cfg.kl_loss_coef > 0 and REF_LOG_PROBS not in micro:
            raise KeyError(f"kl_loss_coef > 0 needs {REF_LOG_PROBS!r} in the batch")
        if cfg.corrections and ROLLOUT_LOG_PROBS not in micro:
            raise KeyError(f"actor.loss.corrections need {ROLLOUT_LOG_PROBS!r} in the batch")
        old = micro.get(OLD_LOG_PROBS, None)
        mask = micro.get(RESPONSE_MASK)
        extra: dict[str, float] = {}
        if old is None:  # an on-policy step: the policy before the update is this one
            old = log_probs.detach()
            extra = _rollout_mismatch(old, micro.get(ROLLOUT_LOG_PROBS, None), mask)
        loss, metrics = actor_loss(
            log_probs, old, micro.get(ADVANTAGES), mask, config=cfg, agg=agg, entropy=entropy,
            ref_log_probs=micro.get(REF_LOG_PROBS) if cfg.kl_loss_coef > 0 else None,
            rollout_log_probs=micro.get(ROLLOUT_LOG_PROBS) if cfg.corrections else None)
        return loss, {**metrics, **extra}

    def _check(self, td: TensorDict) -> None:
        missing = [k for k in (ADVANTAGES, RESPONSE_MASK) if k not in td]
        if missing:
            raise KeyError(f"update needs {missing} in the batch (keys: {sorted(td.keys())})")
        if OLD_LOG_PROBS not in td and not self.config.on_policy:
            raise KeyError(f"update needs {OLD_LOG_PROBS!r}: with ppo_epochs="
                           f"{self.config.ppo_epochs}, ppo_mini_batch_size="
                           f"{self.config.ppo_mini_batch_size} and corrections "
                           f"{[c.name for c in self.config.loss.corrections]} the step is not "
                           f"on-policy")

    def update(self, td: TensorDict) -> dict[str, float]:
        """PPO epochs over mini-batches of ``td``; returns ``actor/...`` metrics (loss,
        pg_loss, clip fractions, ppo_kl, entropy, kl_ref, grad_norm, lr). Without
        ``old_log_probs`` (an `on_policy` step) they are this forward's, detached, and the
        metrics add the rollout mismatch (``log_prob_diff_abs_mean`` / ``_max``)."""
        self._check(td)
        return self.train_batch(td, self._micro_loss)

    def compute_gradients(self, td: TensorDict) -> dict[str, float]:
        """Forward/backward all of ``td`` as one mini-batch, without an optimizer step
        (the gradients stay in ``.grad``): for tests and debugging."""
        self._check(td)
        return self.accumulate(td, self._micro_loss)


class FSDPReference(FSDPPolicy):
    """The frozen reference policy (no optimizer)."""

    metric_prefix = "ref"

    def __init__(self, config: ActorConfig, model_kwargs: dict[str, Any] | None = None
                 ) -> None:
        super().__init__(config, trainable=False, model_kwargs=model_kwargs)

    def compute_ref_log_prob(self, td: TensorDict) -> TensorDict:
        """``ref_log_probs [B, R]`` of ``td``'s responses."""
        return self.log_probs(td, REF_LOG_PROBS)


# --- Ray workers --------------------------------------------------------------------------------
class ActorWorker(Worker):
    """One rank of the actor group (`FSDPActor` plus weight sync to the rollout engines)."""

    def __init__(self, config: ActorConfig) -> None:
        self.init_process_group()
        self.actor = FSDPActor(config)

    @remote(Dispatch.DP_SPLIT)
    def compute_log_prob(self, batch: TensorDict, with_entropy: bool = False) -> TensorDict:
        return self.actor.compute_log_prob(batch, with_entropy)

    @remote(Dispatch.DP_SPLIT_RAW)
    def update(self, batch: TensorDict) -> dict[str, float]:
        """Metrics are reduced over ranks already: every rank returns the same dict."""
        return self.actor.update(batch)

    @remote(Dispatch.ONE_TO_ALL, Execute.RANK_ZERO)
    def compute_dtype(self) -> dict[str, Any]:
        """``{"dtype", "seconds", "reason"}``: what the forward and backward compute in, and
        for ``param_dtype: auto`` the timings it was chosen on (`toolrl.workers.compute_dtype`)."""
        choice = self.actor.dtype_choice
        if choice is not None:
            return choice.to_dict()
        return {"dtype": self.actor.compute_dtype, "seconds": {}, "reason": "as configured"}

    @remote(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.actor.save_checkpoint(path)

    @remote(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.actor.load_checkpoint(path)

    @remote(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str, merged: bool = False) -> str | None:
        """Every rank gathers; rank 0 writes (its entry of the result is the path). A LoRA
        actor writes its adapter (PEFT format), or with ``merged`` the merged model."""
        out = self.actor.export_hf(path, merged=merged)
        return str(out) if out is not None else None

    @remote(Dispatch.DP_SPLIT)
    def compute_ref_log_prob(self, batch: TensorDict) -> TensorDict:
        """A LoRA actor's reference log-probs: the same model with its adapter off."""
        return self.actor.compute_ref_log_prob(batch)

    # weight sync
    @remote(Dispatch.ONE_TO_ALL)
    def push_weights_local(self) -> int:
        """Push into the engines registered in rank 0's process (colocated rollout, see
        `toolrl.weights.colocated.register_local_engine`); returns the new policy version."""
        return self.actor.weights.push_local(local_engines())

    @remote(Dispatch.ONE_TO_ALL, Execute.RANK_ZERO)
    def weight_sync_endpoint(self, backend: str | None = None) -> tuple[str, int]:
        """Address and port on rank 0's node for the weight sync group: on the gloo route a
        rendezvous store already listening there (`WeightSync.reserve_port`); vLLM's NCCL route
        makes its own store, so it gets a port that was free a moment ago."""
        import ray  # lazy: this module imports without Ray (tests collect it where Ray is absent)

        host = ray.util.get_node_ip_address()
        if backend == "nccl":
            return host, free_port()
        return host, self.actor.weights.reserve_port(host)

    @remote(Dispatch.ONE_TO_ALL)
    def connect_weight_sync(self, master_addr: str, master_port: int, world_size: int,
                            backend: str | None = None, wire_dtype: str | None = None) -> None:
        """Rank 0 joins the sync group as its rank 0 (call together with the rollout side);
        ``wire_dtype``: the NCCL route sends floating-point weights in it (the engines')."""
        self.actor.weights.connect(master_addr, master_port, world_size, backend,
                                   wire_dtype=wire_dtype)

    @remote(Dispatch.ONE_TO_ALL, Execute.RANK_ZERO)
    def weight_metadata(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, dtype, shape) of every tensor `push_weights` sends, in order (the NCCL route's
        receivers need it)."""
        return self.actor.weights.metadata()

    @remote(Dispatch.ONE_TO_ALL)
    def push_weights(self) -> int:
        """Broadcast the weights over the sync group; returns the new policy version."""
        return self.actor.weights.push_group()

    @remote(Dispatch.ONE_TO_ALL)
    def weights_checksum(self) -> str | None:
        """SHA-256 of the full weights (rank 0's entry; None on the others)."""
        return self.actor.weights.checksum()

    @remote(Dispatch.ONE_TO_ALL, Execute.RANK_ZERO)
    def policy_version(self) -> int:
        return self.actor.weights.version

    @remote(Dispatch.ONE_TO_ALL)
    def set_policy_version(self, version: int) -> None:
        """Set the push counter (a resumed run continues the version it saved at)."""
        self.actor.weights.version = int(version)


class RefWorker(Worker):
    """One rank of the reference group (colocate it with the actor: a fused group)."""

    def __init__(self, config: ActorConfig) -> None:
        self.init_process_group()
        self.ref = FSDPReference(config)

    @remote(Dispatch.DP_SPLIT)
    def compute_ref_log_prob(self, batch: TensorDict) -> TensorDict:
        return self.ref.compute_ref_log_prob(batch)


def _rollout_mismatch(log_probs: torch.Tensor, rollout: torch.Tensor | None,
                      mask: torch.Tensor) -> dict[str, float]:
    """|trainer - engine| log-prob on the sampled tokens (token-mean and max)."""
    valid = mask.bool()
    if rollout is None or not valid.any():
        return {}
    diff = (log_probs - rollout)[valid].abs()
    return {"log_prob_diff_abs_mean": float(diff.mean()),
            "log_prob_diff_abs_max": float(diff.max())}


__all__ = [
    "ENTROPY",
    "ActorConfig",
    "ActorWorker",
    "FSDPActor",
    "FSDPPolicy",
    "FSDPReference",
    "RefWorker",
]

