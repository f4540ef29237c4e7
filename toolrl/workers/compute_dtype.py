"""``param_dtype: auto``: the training compute dtype chosen by timing the model's own step.

Which dtype trains faster on a CPU is a property of the machine and the model, not something
to assume: torch 2.13's bf16 matmul ran at 2.35x its fp32 on an AMD EPYC family 25 model 17
(avx512_bf16, no AMX) and at half of it on an Intel Xeon family 6 model 207 with AMX, and on
the same EPYC a bf16 actor sped up SmolLM2-135M's GRPO update 1.5x while it slowed the tiny
model's quickstart update down (benchmarks/results/real_fc_account.md). So `timed_choice` runs
one forward and backward of the model itself, the way training will run it, on a
``PROBE_TOKENS``-long sequence in float32 and in bfloat16, alternating (one untimed pass of
each first, then ``reps`` of each, the fastest counted: four passes by default, a cost at the
actor's start-up), and takes bfloat16 only when it is at least ``MARGIN`` times faster. The
weights and AdamW stay in the model's ``dtype`` either way: bf16 is the compute dtype (FSDP2's
``param_dtype`` in the actor, autocast in the warm start).

On CUDA ``auto`` is bfloat16 where the GPU supports it (tensor cores), float32 elsewhere,
without timing (`cuda_choice`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

AUTO = "auto"
MARGIN = 1.1  # bf16 must be this much faster: a near tie keeps the exact dtype
PROBE_TOKENS = 256
DTYPES = ("float32", "bfloat16")
# in a run directory: the actor's compute dtype and, for ``auto``, the timings it was chosen on
COMPUTE_DTYPE_FILE = "compute_dtype.json"


@dataclass(frozen=True)
class DtypeChoice:
    """The compute dtype picked for a model, and the timings it was picked on."""

    dtype: str  # "float32" or "bfloat16"
    seconds: dict[str, float] = field(default_factory=dict)  # one step per timed dtype
    reason: str = ""

    def describe(self) -> str:
        """One line for the run log."""
        return f"{self.dtype} ({self.reason})"

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "seconds": dict(self.seconds), "reason": self.reason}


def is_auto(value: object) -> bool:
    return isinstance(value, str) and value == AUTO


def cuda_choice() -> DtypeChoice:
    """``auto`` on a GPU: bf16 where it is supported."""
    bf16 = torch.cuda.is_bf16_supported()
    return DtypeChoice("bfloat16" if bf16 else "float32",
                       reason="CUDA " + ("supports bf16" if bf16 else "without bf16"))


def probe_ids(model: nn.Module, device: torch.device | str, tokens: int = PROBE_TOKENS
              ) -> torch.Tensor:
    """A fixed ``[1, tokens]`` sequence of the model's vocabulary (its global RNG untouched)."""
    config = getattr(model, "config", None)
    vocab = int(getattr(config, "vocab_size", 0) or 1000)
    tokens = min(tokens, int(getattr(config, "max_position_embeddings", 0) or tokens))
    return torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(0)
                         ).to(device)


def train_step(model: nn.Module, ids: torch.Tensor) -> None:
    """One forward and backward of ``model`` on ``ids`` (log-probs over the vocabulary, as
    the losses take them); its gradients are dropped."""
    out = model(input_ids=ids)
    logits = out.logits if hasattr(out, "logits") else out[0]
    torch.log_softmax(logits.float(), dim=-1).mean().backward()
    model.zero_grad(set_to_none=True)


@contextlib.contextmanager
def autocast(dtype: str | None, device: str = "cpu") -> Iterator[None]:
    """``torch.autocast`` to ``dtype`` (bf16 / fp16); float32 (or None): nothing."""
    if dtype in (None, "float32"):
        yield
        return
    with torch.autocast(device_type=device, dtype=getattr(torch, dtype)):
        yield


def timed_choice(steps: Mapping[str, Callable[[], None]], *, what: str, margin: float = MARGIN,
                 reps: int = 1) -> DtypeChoice:
    """Time ``steps["float32"]`` and ``steps["bfloat16"]`` (each one forward and backward),
    alternating, and choose; ``what`` names the step in the reason."""
    best = dict.fromkeys(DTYPES, float("inf"))
    with torch.random.fork_rng(devices=[]):  # dropout's draws leave the run's RNG as it was
        for i in range(reps + 1):
            for dtype in DTYPES:
                start = time.perf_counter()
                steps[dtype]()
                if i:  # the first pass of each sets its kernels up
                    best[dtype] = min(best[dtype], time.perf_counter() - start)
    fp32, bf16 = best["float32"], best["bfloat16"]
    speedup = fp32 / bf16 if bf16 > 0 else 0.0
    dtype = "bfloat16" if speedup >= margin else "float32"
    reason = (f"{what} took {fp32:.3g} s in float32 and {bf16:.3g} s in bfloat16 on this "
              f"machine: {speedup:.2f}x, {'at least' if dtype == 'bfloat16' else 'under'} the "
              f"{margin:g}x asked")
    return DtypeChoice(dtype, {"float32": fp32, "bfloat16": bf16}, reason)


def choose_autocast(model: nn.Module, tokens: int = PROBE_TOKENS) -> DtypeChoice:
    """``auto`` for a model trained under `autocast` (the warm start): fp32 against bf16
    autocast over the same fp32 weights. The model's mode and gradients are left as they
    were."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        return cuda_choice()
    ids = probe_ids(model, device, tokens)
    was_training = model.training
    model.train()

    def bf16() -> None:
        with autocast("bfloat16", device.type):
            train_step(model, ids)

    try:
        return timed_choice({"float32": lambda: train_step(model, ids), "bfloat16": bf16},
                            what=f"a {ids.shape[1]}-token forward and backward of this model")
    finally:
        model.train(was_training)


__all__ = ["AUTO", "COMPUTE_DTYPE_FILE", "DTYPES", "MARGIN", "PROBE_TOKENS", "DtypeChoice",
           "autocast", "choose_autocast", "cuda_choice", "is_auto", "probe_ids", "timed_choice",
           "train_step"]
