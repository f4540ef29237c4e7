"""What a training step computed: tokens, FLOP and FLOP/s of its update and log-prob passes.

The driver reads the model's shape once (``config.json`` and the safetensors headers, no
weights loaded) and, per step, counts the tokens each pass processed from the batch's
attention mask. FLOP per token is Kaplan et al.'s count (`toolrl.machine.
transformer_flops_per_token`): ``2 N`` for the weights (a tied LM head counted once, its
matmul included) plus attention over the positions a causal token sees, three times that for
forward and backward. Achieved FLOP/s is that over the pass's wall time; set beside the
machine's bare matmul rate (`toolrl.machine.matmul_rate`, measured alone) it says how much of
the machine a phase uses (the recipe's per-phase account, recipes/real_fc.py).

Metrics, per step: ``perf/update_tokens`` (tokens x PPO epochs), ``perf/update_flop_per_s``,
``perf/log_prob_tokens`` and ``perf/log_prob_flop_per_s`` (the forward-only passes: old and
reference log-probs, when the step ran them), ``perf/flop_per_token`` (forward), and where
the step timed its rollout (sync mode) ``perf/rollout_tokens`` and ``perf/rollout_flop_per_s``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tensordict import TensorDict

from toolrl import batch as B
from toolrl.machine import transformer_flops_per_token


@dataclass(frozen=True)
class ModelShape:
    """What FLOP counting needs of a decoder: parameters, layers and hidden size."""

    params: int
    layers: int
    hidden: int

    def flop_per_token(self, context: float, training: bool) -> float:
        """FLOP per token attending to ``context`` positions (x3 with the backward)."""
        return transformer_flops_per_token(self.params, self.layers, self.hidden,
                                           round(context), training)


def model_shape(path: str | Path) -> ModelShape | None:
    """The shape of the Hugging Face checkpoint at ``path`` from its ``config.json`` and its
    safetensors headers (a tensor stored once counts once: tied embeddings are one matrix);
    None where either is missing (a hub id not on disk, a .bin checkpoint)."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    if not (path / "config.json").is_file() or not files:
        return None
    config = json.loads((path / "config.json").read_text())
    config = config.get("text_config", config)
    layers, hidden = config.get("num_hidden_layers"), config.get("hidden_size")
    if not layers or not hidden:
        return None
    params = 0
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                n = 1
                for d in f.get_slice(key).get_shape():
                    n *= int(d)
                params += n
    return ModelShape(params=params, layers=int(layers), hidden=int(hidden))


def batch_tokens(batch: TensorDict) -> tuple[int, float]:
    """The tokens ``batch``'s forward needs (a prompt shared by several rows once, as the
    actor's shared-prefix layout runs it, and every response token; padding not counted) and
    the mean number of positions they attend to under the causal mask (a prompt token at
    position p sees p + 1; a response token also sees its row's prompt)."""
    mask = batch[B.ATTENTION_MASK]
    width = batch[B.PROMPTS].shape[1]
    prompt_real = mask[:, :width].sum(-1).double()
    answers = mask[:, width:].sum(-1).double()
    # a prompt is its real tokens and its length (a real id 0 would read as padding alone)
    first = _first_of_each(torch.cat([batch[B.PROMPTS] * mask[:, :width],
                                      prompt_real[:, None].long()], dim=1))
    prompts = prompt_real[first]
    tokens = float(prompts.sum() + answers.sum())
    attended = float((prompts * (prompts + 1) / 2).sum() +
                     (answers * prompt_real + answers * (answers + 1) / 2).sum())
    return int(tokens), attended / tokens if tokens else 0.0


def _first_of_each(rows: torch.Tensor) -> torch.Tensor:
    """The index of the first occurrence of each distinct row of a 2-D tensor."""
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
    first = torch.full((len(unique),), len(rows), dtype=torch.long)
    return first.scatter_reduce_(0, inverse, torch.arange(len(rows)), reduce="amin")


def step_account(shape: ModelShape | None, batch: TensorDict | None, timing: dict[str, float],
                 *, epochs: int, log_prob_passes: int) -> dict[str, float]:
    """The ``perf/*`` metrics of one step (see the module's docstring); empty without a shape
    or a trained batch. ``log_prob_passes``: the forward-only passes over the batch the step
    ran (old log-probs, reference log-probs)."""
    if shape is None or batch is None:
        return {}
    tokens, context = batch_tokens(batch)
    if not tokens:
        return {}
    forward = shape.flop_per_token(context, training=False)
    out = {"perf/flop_per_token": forward, "perf/update_tokens": float(tokens * epochs)}
    if timing.get("update", 0.0) > 0:
        out["perf/update_flop_per_s"] = 3 * forward * tokens * epochs / timing["update"]
    if log_prob_passes and timing.get("log_probs", 0.0) > 0:
        out["perf/log_prob_tokens"] = float(tokens * log_prob_passes)
        out["perf/log_prob_flop_per_s"] = forward * tokens * log_prob_passes / \
            timing["log_probs"]
    return out


def rollout_account(shape: ModelShape | None, batch: TensorDict, seconds: float | None
                    ) -> dict[str, float]:
    """``perf/rollout_tokens`` (every real token of the rollout's samples: each went through
    the engine at least once, prompts prefilled, responses decoded) and the forward FLOP/s
    they make over the rollout's wall time: a lower bound, since a later turn's prompt is
    prefilled again where the engine's prefix cache misses."""
    if shape is None or not seconds:
        return {}
    tokens, context = batch_tokens(batch)
    if not tokens:
        return {}
    return {"perf/rollout_tokens": float(tokens),
            "perf/rollout_flop_per_s": shape.flop_per_token(context, training=False)
            * tokens / seconds}


__all__ = ["ModelShape", "batch_tokens", "model_shape", "rollout_account", "step_account"]
