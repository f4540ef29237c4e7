"""The weight-sync canary: after each push, engine and actor score the same fixed probe.

A push that silently does nothing (a stale engine, a LoRA merge that never lands, a repacked
CPU kernel that keeps the old weights) shows up nowhere else until the run has wasted days:
the engine keeps sampling from old weights and the loss still goes down. So after every push
each rollout engine generates a few fixed probe sequences (`PROBE_TEXTS`, a fixed seed,
`PROBE_TOKENS` tokens each, its log-prob beside every token: `RolloutWorker.probe`) and the
actor scores the same tokens (the trainer's ``check_sync``). The largest gap is logged as
``sync/probe_max_abs_diff``; past the tolerance of the engine's dtype (`TOLERANCE`, or
``trainer.sync_canary_tolerance``) the run stops with `SyncCanaryError`
(``trainer.sync_canary: stop``) or logs a warning (``warn``). Its time is
``timing/sync_probe_s``, part of ``timing/sync_s``.

The probe samples at the rollout's temperature (top-k and top-p off) and the engine reports
the log-probs of the distribution it sampled from (``EngineConfig.logprobs_mode``
``processed_logprobs``), while the actor divides its logits by the same temperature: the two
agree at any temperature.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

PROBE_TEXTS = ("What is 7 times 3?", "Call the tool add with a=2 and b=5.",
               "Name three colours.", "0 1 2 3 4 5 6 7 8 9")
PROBE_TOKENS = 16
PROBE_SEED = 1234
TOLERANCE = {"float32": 1e-3, "bfloat16": 1e-1, "float16": 5e-2}
"""Largest |engine - actor| log-prob on a probe token that still counts as the same weights
(fp32 on CPU agrees to ~1e-6 to ~1e-4, the larger values where the policy puts a probe token in
a sharp or low-probability spot, whatever the route: a LoRA adapter loaded by vLLM tracks the
merged full weights of the same step and does not drift as the adapter grows; a missed push
after one update differs by ~1e-2 or more)."""


class SyncCanaryError(RuntimeError):
    """Engine and actor disagree on the probe: the last weight push did not land."""


def tolerance(dtype: str | None, override: float | None = None) -> float:
    """The canary's bound for an engine of ``dtype`` (``override`` when given)."""
    if override is not None:
        return float(override)
    return TOLERANCE.get(str(dtype or "float32").removeprefix("torch."), TOLERANCE["bfloat16"])


def probe_diff(engine: torch.Tensor, actor: torch.Tensor, mask: torch.Tensor) -> float:
    """Max |engine - actor| log-prob over the probe's sampled tokens (``mask`` 1) of one
    engine: ``[B, R]`` tensors, the engine's log-probs beside the actor's of the same tokens."""
    diff = (actor - engine)[mask.bool()].abs()
    return float(diff.max()) if diff.numel() else 0.0


def verdict(diffs: Sequence[float], bound: float, version: int) -> str | None:
    """None when every engine agrees with the actor, else the message naming the engines."""
    bad = [(i, d) for i, d in enumerate(diffs) if not d <= bound]  # NaN counts as bad
    if not bad:
        return None
    where = ", ".join(f"rollout worker {i}: {d:.3g}" for i, d in bad)
    return (f"weight-sync canary: after the push of policy version {version} the engine and "
            f"the actor disagree on the probe's log-probs (max |diff| {where}; tolerance "
            f"{bound:g}): the engine is not running the actor's weights. Set "
            f"trainer.sync_canary=warn to go on anyway.")


def max_diff(diffs: Sequence[float]) -> float:
    return float(torch.tensor(list(diffs) or [0.0]).max())


__all__ = ["PROBE_SEED", "PROBE_TEXTS", "PROBE_TOKENS", "TOLERANCE", "SyncCanaryError",
           "max_diff", "probe_diff", "tolerance", "verdict"]
