"""What the FSDP2 actor, reference and critic share: config, model, optimizer, the PPO loop.

`FSDPConfig` holds the fields every trained model has (checkpoint, precision, optimizer,
schedule, mini/micro-batching). `FSDPModel` builds the sharded model and, when trainable, its
AdamW optimizer and warmup schedule; it runs the PPO loop (epochs over mini-batches, one
optimizer step per mini-batch, gradient accumulation over micro-batches whose loss
denominators are the mini-batch's global token and sequence counts, so any split gives the
gradients of one big batch); and it saves, loads and exports checkpoints.

The classes run in any process: inside a worker group they join its process group, alone they
form a world of one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors.torch import save_file
from tensordict import TensorDict
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from toolrl.algo.loss import batch_totals
from toolrl.batch import EPISODE, RESPONSE_MASK, batch_len
from toolrl.workers.compute_dtype import (
    DTYPES,
    DtypeChoice,
    cuda_choice,
    is_auto,
    probe_ids,
    timed_choice,
    train_step,
)
from toolrl.workers.fsdp import (
    all_reduce,
    build_sharded_model,
    default_device,
    device_mesh,
    full_state_dict,
    init_distributed,
    mixed_precision,
    rank,
    ties_embeddings,
    torch_dtype,
    world_size,
)
from toolrl.workers.host_memory import release_memory
from toolrl.workers.micro_batch import mini_batch_slices, plan_micro_batches, take

# ``param_dtype: auto`` as chosen in this process, by (checkpoint, device type)
_CHOSEN: dict[tuple[str, str], DtypeChoice] = {}
LRSchedule = Literal["constant", "cosine"]
LR_SCHEDULES: tuple[str, ...] = get_args(LRSchedule)
# A micro-batch loss function: (micro-batch, LossTotals) -> (scalar loss, float metrics).
MicroLoss = Callable[[TensorDict, "LossTotals"], tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True)
class FSDPConfig:
    """Fields shared by every FSDP2-trained model (actor, critic).

    Attributes:
        model_path: a local Hugging Face checkpoint directory (in an experiment the trainer
            sets it from ``model.path``, or the warm start's checkpoint).
        dtype: dtype the weights are loaded and kept (and optimized) in.
        param_dtype / reduce_dtype: FSDP2 mixed precision: forward/backward compute dtype and
            gradient-reduction dtype (None: keep ``dtype``; fp32 on CPU). ``param_dtype: auto``
            times the model's own forward and backward in float32 and bfloat16 on this machine
            and computes in the faster (`toolrl.workers.compute_dtype`).
        reshard_after_forward: free the gathered parameters after each forward (ZeRO-3 style).
        gradient_checkpointing: recompute activations in backward (less memory, more compute).
        use_remove_padding: pack the real tokens of a micro-batch into one row (no compute on
            padding). The actor's scoring attends with torch's varlen kernel on CUDA in
            bf16/fp16 (`toolrl.workers.varlen`); elsewhere, and the critic, through the
            block-diagonal causal mask transformers builds from the position ids.
        lr / betas / eps / weight_decay: AdamW.
        lr_schedule: ``constant`` or ``cosine`` (to ``min_lr_ratio * lr`` at ``total_steps``),
            both after ``warmup_steps`` of linear warmup; counted in optimizer steps.
        warmup_steps: optimizer steps of linear warmup from 0 to ``lr``.
        min_lr_ratio: where the cosine schedule ends, as a fraction of ``lr``.
        total_steps: optimizer steps the schedule spans (0 in a config file: the trainer sets it
            from ``trainer.total_steps``, PPO epochs and mini-batches).
        updates_per_step: optimizer steps of the schedule one `train_batch` (one trainer step)
            stands for, however many mini-batches its batch makes (0 in a config file: the
            trainer sets it beside ``total_steps``; 0 in a worker: each optimizer step moves the
            schedule by one). A batch of another size than planned (per-turn samples, split
            gateway samples, filtered groups, dropped samples) then still moves the schedule by
            one trainer step's share, and it ends with the run, not before.
        grad_clip: max global gradient norm (None or 0: no clipping, the norm is still logged).
        ppo_epochs: passes over each batch in `update`.
        ppo_mini_batch_size: samples per optimizer step over all data-parallel ranks (None: the
            whole batch is one mini-batch); an episode split into several samples (per_turn)
            counts once, its samples together. Must divide by the data-parallel size.
        micro_batch_size: samples per forward/backward on each rank (None: the mini-batch).
        max_tokens_per_micro_batch: dynamic micro-batches: pack samples by real token count up
            to this budget per rank (overrides ``micro_batch_size``).
        log_prob_micro_batch_size: samples per forward when only computing (log-probs, values);
            None: ``micro_batch_size``. The token budget applies to both when set.
        shuffle: shuffle samples before cutting mini-batches (seeded by ``seed`` and the
            optimizer step, so a resumed run shuffles the same way).
        seed: seed of that shuffle (in an experiment the trainer sets it from ``seed``).
    """

    model_path: str = ""
    dtype: str = "float32"
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    reshard_after_forward: bool = True
    gradient_checkpointing: bool = False
    use_remove_padding: bool = False
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    lr_schedule: LRSchedule = "constant"
    warmup_steps: int = 0
    total_steps: int = 0
    updates_per_step: int = 0
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    ppo_epochs: int = 1
    ppo_mini_batch_size: int | None = None
    micro_batch_size: int | None = None
    max_tokens_per_micro_batch: int | None = None
    log_prob_micro_batch_size: int | None = None
    shuffle: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("dtype", "param_dtype", "reduce_dtype"):
            if name == "param_dtype" and is_auto(self.param_dtype):
                continue
            try:
                torch_dtype(getattr(self, name))
            except ValueError as exc:  # name the field: the config pass keys it
                raise ValueError(f"{name}: {exc}") from None
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"unknown lr_schedule {self.lr_schedule!r}; choose one of "
                             f"{list(LR_SCHEDULES)}")
        if self.lr_schedule == "cosine" and 0 < self.total_steps <= self.warmup_steps:
            raise ValueError("lr_schedule='cosine' needs total_steps > warmup_steps "
                             f"(got total_steps={self.total_steps}, "
                             f"warmup_steps={self.warmup_steps})")
        for name in ("ppo_epochs",):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("ppo_mini_batch_size", "micro_batch_size", "max_tokens_per_micro_batch",
                     "log_prob_micro_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if self.updates_per_step < 0:
            raise ValueError(f"updates_per_step must be >= 0, got {self.updates_per_step}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.lr < 0:
            raise ValueError(f"lr must be >= 0, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


@dataclass(frozen=True)
class LossTotals:
    """Global counts of the current mini-batch (all micro-batches, all ranks)."""

    tokens: float
    seqs: float
    samples: int


def lr_lambda(config: FSDPConfig) -> Callable[[float], float]:
    """Multiplier of ``config.lr`` after ``step`` optimizer steps (warmup, then schedule);
    ``step`` may be fractional (`FSDPModel.train_batch` with ``updates_per_step``)."""
    warmup, total, floor = config.warmup_steps, config.total_steps, config.min_lr_ratio

    def factor(step: float) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if config.lr_schedule == "constant":
            return 1.0
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


class _MetricSums:
    """Per-mini-batch metric reduction across micro-batches and ranks (one all-reduce)."""

    SUMMED = ("loss", "pg_loss", "vf_loss")  # already divided by the global totals
    MAXED = ("ratio_max", "log_prob_diff_abs_max")

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.maxes: dict[str, float] = {}
        self.tokens = 0.0

    def add(self, metrics: dict[str, float]) -> None:
        tokens = float(metrics.get("tokens", 0.0))
        self.tokens += tokens
        for key, value in metrics.items():
            if key == "tokens":
                continue
            if key in self.MAXED:
                self.maxes[key] = max(self.maxes.get(key, -math.inf), float(value))
            elif key in self.SUMMED:
                self.sums[key] = self.sums.get(key, 0.0) + float(value)
            else:  # a mean over the micro-batch's tokens: weight it by them
                self.sums[key] = self.sums.get(key, 0.0) + float(value) * tokens

    def reduce(self, global_tokens: float) -> dict[str, float]:
        keys = sorted(self.sums)
        summed = all_reduce(torch.tensor([self.sums[k] for k in keys], dtype=torch.float64))
        out = {}
        for key, value in zip(keys, summed.tolist(), strict=True):
            out[key] = value if key in self.SUMMED else value / max(global_tokens, 1.0)
        mkeys = sorted(self.maxes)
        if mkeys:
            maxed = all_reduce(torch.tensor([self.maxes[k] for k in mkeys], dtype=torch.float64),
                               dist.ReduceOp.MAX)
            out.update(zip(mkeys, maxed.tolist(), strict=True))
        return out


def tensors_only(td: TensorDict) -> TensorDict:
    """The tensor entries of ``td`` (per-sample Python objects are not needed for compute and
    would be copied with every micro-batch)."""
    data = {k: v for k, v in td.items() if isinstance(v, torch.Tensor)}
    return TensorDict(data, batch_size=[batch_len(td)])


class FSDPModel:
    """A Hugging Face model sharded with FSDP2, optionally with AdamW and an LR schedule.

    Args:
        config: the `FSDPConfig` (or a subclass).
        trainable: build the optimizer and schedule; otherwise parameters are frozen.
        auto_cls: the transformers auto class (AutoModelForCausalLM by default).
        model_kwargs: extra ``from_pretrained`` arguments.
        prepare: transforms the unsharded model before sharding (LoRA adapters); the optimizer
            then holds only the parameters that still require gradients.
    """

    metric_prefix = "model"

    def __init__(self, config: FSDPConfig, trainable: bool = True, auto_cls: Any = None,
                 model_kwargs: dict[str, Any] | None = None,
                 prepare: Callable[[nn.Module], nn.Module] | None = None) -> None:
        if not config.model_path:
            raise ValueError(f"{type(self).__name__}: config.model_path is empty")
        init_distributed()
        self.config = config
        self.trainable = trainable
        self.device = default_device()
        self.mesh = device_mesh(self.device)
        self.dtype_choice: DtypeChoice | None = None
        param_dtype = config.param_dtype
        if is_auto(param_dtype):
            self.dtype_choice = self._choose_dtype(auto_cls, model_kwargs)
            param_dtype = self.dtype_choice.dtype
        # the checkpoint is read once (rank 0) and broadcast into every rank's shards
        self.model: nn.Module = build_sharded_model(
            config.model_path, self.mesh, auto_cls, config.dtype,
            gradient_checkpointing=config.gradient_checkpointing and trainable,
            mp_policy=mixed_precision(param_dtype, config.reduce_dtype),
            reshard_after_forward=config.reshard_after_forward, freeze=not trainable,
            prepare=prepare, **(model_kwargs or {}))
        self.hf_config = self.model.config
        self.tied = ties_embeddings(self.model)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.num_updates = 0  # optimizer steps taken (drives the shuffling)
        self.schedule_pos = 0.0  # where the LR schedule stands, in planned optimizer steps
        self.frozen_base = prepare is not None and trainable  # checkpoints skip frozen weights
        if trainable:
            self.optimizer = torch.optim.AdamW(
                [p for p in self.model.parameters() if p.requires_grad], lr=config.lr,
                betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay)
            factor = lr_lambda(config)
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda _: factor(self.schedule_pos))

    def _choose_dtype(self, auto_cls: Any, model_kwargs: dict[str, Any] | None) -> DtypeChoice:
        """``param_dtype: auto`` resolved (`toolrl.workers.compute_dtype`): the checkpoint
        sharded as this model will be, once with an fp32 and once with a bf16 mixed-precision
        policy, each timed on a forward and backward; every rank takes rank 0's choice. A
        process chooses once per checkpoint (a reference model follows its actor)."""
        key = (self.config.model_path, self.device.type)
        if key in _CHOSEN:
            return _CHOSEN[key]
        if self.device.type == "cuda":
            choice: DtypeChoice | None = cuda_choice()
        else:
            models = {dtype: build_sharded_model(
                self.config.model_path, self.mesh, auto_cls, self.config.dtype,
                mp_policy=mixed_precision(dtype, self.config.reduce_dtype),
                reshard_after_forward=self.config.reshard_after_forward,
                **(model_kwargs or {})) for dtype in DTYPES}
            ids = probe_ids(models["float32"], self.device)
            for model in models.values():
                model.train()
            choice = timed_choice(
                {dtype: lambda m=model: train_step(m, ids) for dtype, model in models.items()},
                what=f"a {ids.shape[1]}-token forward and backward of this model, sharded")
            del models
            release_memory()
        chosen = [choice]
        if world_size() > 1:
            dist.broadcast_object_list(chosen, src=0)
        assert chosen[0] is not None
        _CHOSEN[key] = chosen[0]
        return chosen[0]

    @property
    def compute_dtype(self) -> str:
        """The dtype the forward and backward compute in (``param_dtype`` as resolved)."""
        if self.dtype_choice is not None:
            return self.dtype_choice.dtype
        return str(torch_dtype(self.config.param_dtype or self.config.dtype)).removeprefix(
            "torch.")

    # --- batching -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return rank()

    @property
    def world_size(self) -> int:
        return world_size()

    def _local_mini_batch_size(self, n: int) -> int:
        size = self.config.ppo_mini_batch_size
        if size is None:
            return n
        w = self.world_size
        if size % w:
            raise ValueError(f"ppo_mini_batch_size={size} does not divide by the {w} "
                             f"data-parallel ranks")
        return size // w

    def _plan(self, td: TensorDict, forward_only: bool) -> list[list[int]]:
        cfg = self.config
        size = cfg.micro_batch_size
        if forward_only and cfg.log_prob_micro_batch_size is not None:
            size = cfg.log_prob_micro_batch_size
        units = self._micro_units(td) if cfg.max_tokens_per_micro_batch is not None else None
        return plan_micro_batches(td, size, cfg.max_tokens_per_micro_batch, units=units)

    def _micro_units(self, td: TensorDict) -> torch.Tensor | None:
        """Rows that token-budget micro-batches must keep together (``[b]`` unit ids), or None:
        every row on its own."""
        return None

    def forward_batches(self, td: TensorDict,
                        fn: Callable[[TensorDict], dict[str, torch.Tensor]]) -> TensorDict:
        """Run ``fn`` (no grad, eval mode) on every micro-batch of ``td``; stitch the per-row
        outputs back together in ``td``'s row order."""
        self.model.eval()
        td = tensors_only(td)
        n = batch_len(td)
        parts: dict[str, list[torch.Tensor]] = {}
        order: list[int] = []
        with torch.no_grad():
            for index in self._plan(td, forward_only=True):
                for key, value in fn(take(td, index).to(self.device)).items():
                    parts.setdefault(key, []).append(value.detach().cpu())
                order.extend(index)
        inverse = torch.empty(n, dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(n)
        return TensorDict({k: torch.cat(v)[inverse] for k, v in parts.items()}, batch_size=[n])

    # --- training -------------------------------------------------------------------------
    def _require_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError(f"{type(self).__name__} was built with trainable=False")
        return self.optimizer

    def accumulate(self, mini: TensorDict, micro_loss: MicroLoss) -> dict[str, float]:
        """Zero the gradients, then forward/backward every micro-batch of the mini-batch
        ``mini`` (this rank's part) so the gradients are those of the whole global mini-batch
        with its global token/sequence counts as denominators. Returns the reduced metrics."""
        self._require_optimizer().zero_grad(set_to_none=True)
        self.model.train()
        mini = tensors_only(mini)
        mask = mini.get(RESPONSE_MASK)
        tokens, seqs = batch_totals(mask)
        totals_t = all_reduce(torch.tensor([tokens, seqs, batch_len(mini)], dtype=torch.float64))
        totals = LossTotals(tokens=max(float(totals_t[0]), 1.0),
                            seqs=max(float(totals_t[1]), 1.0), samples=int(totals_t[2]))
        sums = _MetricSums()
        w = self.world_size
        for index in self._plan(mini, forward_only=False):
            micro = take(mini, index).to(self.device)
            loss, metrics = micro_loss(micro, totals)
            # FSDP2 averages gradients over ranks; the loss is a share of the global total.
            (loss * w).backward()
            sums.add(metrics)
        return sums.reduce(totals.tokens)

    def step(self, schedule_pos: float | None = None) -> dict[str, float]:
        """Clip the gradients, take an optimizer step (skipped on a non-finite norm) and move
        the schedule to ``schedule_pos`` (None: one step on). Returns grad_norm and lr."""
        optimizer = self._require_optimizer()
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.config.grad_clip or math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        norm_value = float(norm)
        lr = optimizer.param_groups[0]["lr"]
        skipped = not math.isfinite(norm_value)
        if not skipped:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.schedule_pos = self.schedule_pos + 1 if schedule_pos is None else schedule_pos
        if self.scheduler is not None:
            self.scheduler.step()
        self.num_updates += 1
        return {"grad_norm": norm_value, "lr": lr, "step_skipped": float(skipped)}

    def train_batch(self, td: TensorDict, micro_loss: MicroLoss) -> dict[str, float]:
        """PPO epochs over mini-batches of ``td``: one optimizer step per mini-batch.

        A mini-batch counts episodes: where an episode spans several rows (``episode``: the
        per_turn history policy), its rows train together and count once, so the optimizer
        steps as often as it would on the episode as one row.

        Returns every metric averaged over the mini-batches, prefixed with `metric_prefix`.
        """
        td = tensors_only(td)
        n = batch_len(td)
        if n == 0:
            raise ValueError("update got an empty batch")
        units = _episode_rows(td)
        mini_size = self._local_mini_batch_size(len(units))
        slices = mini_batch_slices(len(units), mini_size)
        # the schedule moves by updates_per_step over this batch's optimizer steps, evenly
        updates = self.config.ppo_epochs * len(slices)
        planned = self.config.updates_per_step or updates
        start = self.schedule_pos
        history: list[dict[str, float]] = []
        for _ in range(self.config.ppo_epochs):
            order = list(range(len(units)))
            if self.config.shuffle:
                gen = torch.Generator().manual_seed(self.config.seed * 1_000_003
                                                    + self.num_updates)
                order = torch.randperm(len(units), generator=gen).tolist()
            for sl in slices:
                rows = sorted(row for unit in order[sl] for row in units[unit])
                metrics = self.accumulate(take(td, rows), micro_loss)
                metrics.update(self.step(start + planned * (len(history) + 1) / updates))
                history.append(metrics)
        keys = sorted({k for h in history for k in h})
        out = {f"{self.metric_prefix}/{k}": sum(h.get(k, 0.0) for h in history) / len(history)
               for k in keys}
        out[f"{self.metric_prefix}/lr"] = history[-1]["lr"]
        out[f"{self.metric_prefix}/num_updates"] = float(self.num_updates)
        return out

    # --- checkpoints ----------------------------------------------------------------------
    def _state_options(self) -> StateDictOptions:
        """Checkpoints hold only trainable parameters when the base is frozen (LoRA): the
        frozen weights come back from ``model_path``."""
        return StateDictOptions(ignore_frozen_params=self.frozen_base,
                                strict=not self.frozen_base)

    def _state(self) -> dict[str, Any]:
        if self.optimizer is not None:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer,
                                                options=self._state_options())
            if self.frozen_base:  # a tied lm_head comes through ignore_frozen_params: drop it
                trained = {n for n, p in self.model.named_parameters() if p.requires_grad}
                model_sd = {k: v for k, v in model_sd.items() if k in trained}
            state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        else:
            state = {"model": get_state_dict(self.model, [], options=self._state_options())[0]}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        state["meta"] = {"num_updates": self.num_updates, "schedule_pos": self.schedule_pos}
        return state

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Save model, optimizer, schedule and step counter with torch.distributed.checkpoint
        (every rank writes its shards; reloads into any world size). All ranks call this."""
        Path(path).mkdir(parents=True, exist_ok=True)
        dcp.save(self._state(), checkpoint_id=str(path))

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        """Restore what `save_checkpoint` wrote (in place, resharding if needed)."""
        if not Path(path).is_dir():
            raise FileNotFoundError(f"no checkpoint at {path}")
        state = self._state()
        dcp.load(state, checkpoint_id=str(path))
        if self.optimizer is not None:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"], options=self._state_options())
        else:
            set_state_dict(self.model, [], model_state_dict=state["model"], optim_state_dict={},
                           options=self._state_options())
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.num_updates = int(state["meta"]["num_updates"])
        self.schedule_pos = float(state["meta"]["schedule_pos"])

    def export_hf(self, path: str | os.PathLike) -> Path | None:
        """Write a Hugging Face checkpoint (safetensors, config, tokenizer) to ``path``.

        All ranks call this (the weights are gathered); rank 0 writes. ``lm_head.weight`` is
        dropped with tied embeddings, as in the original checkpoint.
        """
        return self._write_hf(full_state_dict(self.model, skip_tied=True), path)

    def _write_hf(self, state: dict[str, torch.Tensor], path: str | os.PathLike) -> Path | None:
        """Rank 0 writes ``state`` (full tensors, checkpoint names) as an HF checkpoint;
        every rank calls it."""
        out = Path(path)
        if self.rank == 0:
            _save_hf(self.config.model_path, self.hf_config, state, out)
        if dist.is_initialized():
            dist.barrier()
        return out if self.rank == 0 else None


def _save_hf(source: str, config: Any, state: dict[str, torch.Tensor], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    split = split_torch_state_dict_into_shards(state, filename_pattern="model{suffix}.safetensors",
                                               max_shard_size="5GB")
    for filename, names in split.filename_to_tensors.items():
        save_file({n: state[n].contiguous() for n in names}, str(out / filename),
                  metadata={"format": "pt"})
    if split.is_sharded:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size()
                                                for t in state.values())},
                 "weight_map": split.tensor_to_filename}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    src = Path(source)
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt",
                 "tokenizer.model", "added_tokens.json", "toolrl_vocab.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    if (src / "real_tokenizer").is_dir():  # a compact vocabulary's real tokenizer
        shutil.copytree(src / "real_tokenizer", out / "real_tokenizer", dirs_exist_ok=True)


def _episode_rows(td: TensorDict) -> list[list[int]]:
    """The rows of each episode, in order of first row: every row its own episode unless
    ``td`` holds `EPISODE` (each row's episode lead)."""
    leads = td.get(EPISODE, None)
    if leads is None:
        return [[i] for i in range(batch_len(td))]
    units: dict[int, list[int]] = {}
    for row, lead in enumerate(leads.tolist()):
        units.setdefault(int(lead), []).append(row)
    return list(units.values())


__all__ = ["LR_SCHEDULES", "FSDPConfig", "FSDPModel", "LossTotals", "lr_lambda", "tensors_only"]

