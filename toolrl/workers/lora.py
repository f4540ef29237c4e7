"""LoRA actors through PEFT: the config, the wrapping, the merged and the adapter-only views.

``actor.lora.rank > 0`` turns the actor into a PEFT LoRA model before FSDP2 shards it
(`LoraAdapter.apply`: ``peft.get_peft_model`` injects the LoRA layers into the Hugging Face
model in place, so the sharded module, its state-dict names and the scoring path stay those of
the HF model). Only adapter parameters require gradients, so the optimizer holds only them.
The reference policy is the same model with the adapter switched off (`LoraAdapter.disabled`,
PEFT's ``disable_adapter``): no second copy of the base weights.

Two ways to bring the engines up to date (``actor.lora.sync``):

- ``merge``: the full weights with each adapter merged in (`LoraAdapter.merged`, W + s·B·A on
  the gathered tensors, the trained adapter untouched) under the checkpoint's names, through
  the usual weight push; works with any engine;
- ``adapter``: only the adapter, written in PEFT's format and loaded by the engine as a new
  LoRA version (vLLM's LoRA support;
  `toolrl.weights.engine_routes.EngineWeightRoutes.load_adapter_sync`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from torch import nn

from toolrl.weights.buckets import Meta, Named

LoraSync = Literal["merge", "adapter"]
LORA_SYNCS: tuple[str, ...] = get_args(LoraSync)
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER = "default"  # PEFT's name of the one adapter
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values


@dataclass(frozen=True)
class LoraConfig:
    """``actor.lora``: train LoRA adapters instead of the full weights.

    Attributes:
        rank: the adapters' rank; 0 (the default) trains the full weights.
        alpha: LoRA's scale numerator (the update is ``alpha / rank * B @ A``).
        dropout: dropout on the adapters' input while training.
        target_modules: names (suffixes) of the linear layers that get adapters.
        sync: how the engines get the policy: ``merge`` (full weights with the adapter
            merged in, any engine) or ``adapter`` (only the adapter, into vLLM's LoRA support).
        export_merged: the run's final export also writes the merged model (``final_hf``)
            beside the adapter (``final_adapter``).
    """

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_TARGETS
    sync: LoraSync = "merge"
    export_merged: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, str):
            object.__setattr__(self, "target_modules", (self.target_modules,))
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if self.rank < 0:
            raise ValueError(f"actor.lora.rank must be >= 0 (0: no LoRA), got {self.rank}")
        if self.sync not in LORA_SYNCS:
            raise ValueError(f"actor.lora.sync={self.sync!r} is not valid; choose one of "
                             f"{list(LORA_SYNCS)}")
        if not self.enabled:
            changed = [f.name for f in dataclasses.fields(self) if f.name != "rank"
                       and getattr(self, f.name) != f.default]
            if changed:
                raise ValueError(f"actor.lora.{changed[0]} is set but actor.lora.rank is 0 "
                                 f"(LoRA is off): set actor.lora.rank > 0 or drop "
                                 f"actor.lora.{changed[0]}")
            return
        if not self.alpha > 0:
            raise ValueError(f"actor.lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"actor.lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules or not all(isinstance(t, str) and t
                                              for t in self.target_modules):
            raise ValueError(f"actor.lora.target_modules must name at least one layer, got "
                             f"{list(self.target_modules)}")
        if self.sync == "adapter":
            _ = self.engine_rank  # the engine must be able to hold the adapter

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def engine_rank(self) -> int:
        """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
        for r in VLLM_LORA_RANKS:
            if r >= self.rank:
                return r
        raise ValueError(f"actor.lora.rank={self.rank} is above vLLM's largest LoRA rank "
                         f"{VLLM_LORA_RANKS[-1]}")


def lora_config(value: LoraConfig | Mapping[str, Any] | None) -> LoraConfig:
    """A `LoraConfig` from itself, a plain mapping or None (off)."""
    if value is None:
        return LoraConfig()
    if isinstance(value, LoraConfig):
        return value
    return LoraConfig(**dict(value))


def is_adapter_name(name: str) -> bool:
    """Whether a state-dict name belongs to a LoRA adapter (PEFT's ``lora_`` parameters)."""
    return ".lora_" in name


class LoraAdapter:
    """The PEFT LoRA wrapping of one model: apply it, switch it off, merge it, save it."""

    def __init__(self, config: LoraConfig, seed: int = 0) -> None:
        if not config.enabled:
            raise ValueError("LoraAdapter needs lora.rank > 0")
        self.config = config
        self.seed = seed  # the adapters' initialization (PEFT draws the A matrices)
        self.peft: Any = None  # the PeftModel around the HF model
        self.scaling: dict[str, float] = {}  # LoRA module name -> alpha / rank

    def apply(self, model: nn.Module) -> nn.Module:
        """Inject LoRA layers into ``model`` in place (PEFT) and freeze everything else;
        returns ``model`` itself (the HF model, now with adapters). Works on the meta device."""
        # lazy: peft is optional (the lora extra)
        import peft
        from peft.tuners import lora as peft_lora

        cfg = self.config
        peft_cfg = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                   target_modules=list(cfg.target_modules), bias="none",
                                   task_type="CAUSAL_LM")
        try:
            # the A matrices are drawn from the run's seed, not from whatever the process drew
            # before (the roles of a process start in no fixed order): a LoRA run is repeatable
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                # adapters in the base dtype: FSDP2 gathers one dtype per group
                self.peft = peft.get_peft_model(model, peft_cfg, autocast_adapter_dtype=False)
        except ValueError as e:
            raise ValueError(f"actor.lora.target_modules={list(cfg.target_modules)}: {e}"
                             ) from None
        for name, module in model.named_modules():
            if isinstance(module, peft_lora.LoraLayer):
                if not isinstance(module, peft_lora.Linear):
                    raise ValueError(f"actor.lora.target_modules: {name} is a "
                                     f"{type(module.get_base_layer()).__name__}; only linear "
                                     f"layers can take adapters here")
                self.scaling[name] = float(module.scaling[ADAPTER])
        return model

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """The base model: every adapter off inside the block (PEFT's ``disable_adapter``).

        PEFT also turns the adapters' ``requires_grad`` off inside the block; they are kept
        trainable here. FSDP2 fixes each parameter group's gradient dtypes at its lazy init,
        from the parameters that are trainable then: a first forward with the adapter off (the
        reference pass) left a bf16 actor with ``reduce_dtype`` float32 unable to take its
        first gradient ("attempting to assign a gradient with dtype BFloat16 ..."). The block
        is for forwards without gradients; the adapters' forward path is off either way.
        """
        trainable = [p for p in self.peft.parameters() if p.requires_grad]
        with self.peft.disable_adapter():
            for param in trainable:
                param.requires_grad_(True)
            yield

    # --- views of the weights ----------------------------------------------------------------
    def merged(self, named: Iterable[Named]) -> Iterator[Named]:
        """A full-weights stream of the LoRA model (state-dict names, every tensor whole) ->
        the base checkpoint's names, in the same order (`merged_metadata`), with each adapter
        merged into its layer's weight (``W + scaling * B @ A``, computed in float32). Adapter
        tensors are consumed, never changed. Only what follows a weight still waiting for its
        A and B is held back (a layer's bias)."""
        queue: deque[list[Any]] = deque()  # [name, tensor or None while its merge waits]
        parts: dict[str, dict[str, torch.Tensor]] = {}
        slots: dict[str, list[Any]] = {}
        for name, tensor in named:
            module = part = None
            if ".base_layer." in name:
                module, leaf = name.split(".base_layer.", 1)
                if leaf == "weight" and module in self.scaling:
                    part = "W"
                else:
                    queue.append([f"{module}.{leaf}", tensor])
            elif ".lora_A." in name:
                module, part = name.split(".lora_A.", 1)[0], "A"
            elif ".lora_B." in name:
                module, part = name.split(".lora_B.", 1)[0], "B"
            elif is_adapter_name(name):
                raise RuntimeError(f"cannot merge adapter tensor {name!r}")
            else:
                queue.append([name, tensor])
            if part is not None:
                assert module is not None
                got = parts.setdefault(module, {})
                got[part] = tensor
                if part == "W":
                    slots[module] = [f"{module}.weight", None]
                    queue.append(slots[module])
                if len(got) == 3:
                    del parts[module]
                    delta = (got["B"].float() @ got["A"].float()) * self.scaling[module]
                    slots.pop(module)[1] = (got["W"].float() + delta).to(got["W"].dtype)
            while queue and queue[0][1] is not None:
                out_name, out = queue.popleft()
                yield out_name, out
        if parts or queue:
            raise RuntimeError(f"weight stream ended before the adapters of "
                               f"{sorted(parts) or sorted(slots)} were complete")

    @staticmethod
    def merged_metadata(meta: Sequence[Meta]) -> list[Meta]:
        """`merged`'s (name, dtype, shape) list from the LoRA model's."""
        return [(name.replace(".base_layer.", "."), dtype, shape) for name, dtype, shape in meta
                if not is_adapter_name(name)]

    def save_adapter(self, adapter_state: Mapping[str, torch.Tensor], path: str | Path) -> Path:
        """Write the adapter in PEFT's format (``adapter_config.json``,
        ``adapter_model.safetensors``) from its full tensors under the HF model's state-dict
        names. Loads with ``peft.PeftModel.from_pretrained`` and vLLM's ``LoRARequest``."""
        out = Path(path)
        prefixed = {f"base_model.model.{k}": v.detach().cpu().contiguous()
                    for k, v in adapter_state.items()}
        self.peft.save_pretrained(str(out), state_dict=prefixed, safe_serialization=True)
        return out


__all__ = ["DEFAULT_TARGETS", "LORA_SYNCS", "LoraAdapter", "LoraConfig", "is_adapter_name",
           "lora_config"]
