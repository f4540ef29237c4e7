"""The weight-sync canary: after each push, engine and actor score the same fixed probe.

A push that silently does nothing (a stale engine, a LoRA merge that never lands, a repacked
CPU kernel that keeps the old weights) shows up nowhere else until the run has wasted days:
the engine keeps sampling from old weights and the loss still goes down. So after every push
each rollout engine generates a few fixed probe sequences (`PROBE_TEXTS`, a fixed seed,
`PROBE_TOKENS` tokens each, its log-prob beside every token: `RolloutWorker.probe`) and the
actor scores the same tokens (the trainer's ``check_sync``). The largest per-token gap is
logged as ``sync/probe_max_abs_diff``, the mean as ``sync/probe_mean_abs_diff`` (the largest
over engines, each); the engine dtype's statistic (`STATISTIC`) past its bound (`TOLERANCE`,
or ``trainer.sync_canary_tolerance``) stops the run with `SyncCanaryError` or logs a warning
(``trainer.sync_canary``: ``auto`` (default) stops for fp32 engines and warns for bf16 /
fp16, `MODE`; ``stop``; ``warn``; ``off``). The dtype whose rule applies is the less precise
side's (`rule_dtype`): an fp32 engine against an actor computing in bf16 (``actor.param_dtype``
bfloat16, or ``auto`` resolved to it) reads bf16's gaps (max 0.186 / 0.135, mean 0.035 / 0.027
on SmolLM2 on an AMD EPYC family 25 model 17, benchmarks/results/real_fc_account.md). Its
time is ``timing/sync_probe_s``, part of ``timing/sync_s``.

The statistics and bounds are measured (``benchmarks/bench_canary.py``, table in
benchmarks/RESULTS.md):

- fp32: the max, bound 1e-3. A correct push agrees to ~1e-6 .. 1e-4 on every token, whatever
  the route (a LoRA adapter loaded by vLLM tracks the merged full weights of the same step and
  does not drift as the adapter grows); a push missed after one update differs by ~1e-2 or
  more. The default stops.
- bf16: the mean, bound 0.1. SmolLM2-135M, vLLM's CPU engine in bf16 against the bf16 actor,
  28 correct pushes after AdamW steps at lr 1e-6 .. 1e-4: single tokens disagree by up to
  0.31 (the old rule, max <= 0.1, stopped healthy runs at their first push) while the mean
  over the probe's 64 tokens stays within 0.032 .. 0.054. A missed push (the engine one step,
  or six steps, behind) reads 0.033 .. 0.053 at lr <= 1e-5, inside that band: the update moves
  bf16 weights less than the two sides' bf16 kernels disagree, so no statistic of one probe
  can tell it (the engine then samples from nearly the same policy); at lr 1e-4 it reads
  0.12 .. 0.16 (one step) and 0.73 (six). A 24-step run at lr 1e-5 (25 more correct pushes:
  0.032 .. 0.045, single tokens up to 0.32): an engine stale for all 24 steps reads 0.095,
  still under the bound, so at that rate a route that never lands is caught only after some
  25 steps or more. So in bf16 the canary catches gross failures (wrong
  or garbage weights, a route that stops landing once the drift adds up), not one missed
  push at a small learning rate. One model on one kind of kernels is no proof that a healthy
  run elsewhere stays under 0.1 (vLLM's CUDA kernels have not run against the actor; the GPU
  check measured transformers bf16 vs fp32 on the same weights at the 0.5B shape: max 0.0569,
  mean 0.0123, and toolrl's bf16 scoring layouts vs transformers bf16: max 0.05, mean
  <= 0.0093, benchmarks/gpu_check.md): the default warns.
- fp16: not measured; bf16's rule (its finer mantissa keeps the kernels' gap smaller).

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
STATISTIC = {"float32": "max", "bfloat16": "mean", "float16": "mean"}
"""What the verdict reads of an engine's per-token |engine - actor| log-probs (see above)."""
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.1}
"""The bound on the dtype's `STATISTIC` that still counts as the same weights (see above)."""
MODE = {"float32": "stop", "bfloat16": "warn", "float16": "warn"}
"""What ``trainer.sync_canary: auto`` (the default) does past the bound, by the engine's dtype:
fp32 stops; bf16 / fp16 warn, since one engine's kernels measured against another's are no
proof that no healthy push on other hardware or another model comes near the bound."""


class SyncCanaryError(RuntimeError):
    """Engine and actor disagree on the probe: the last weight push did not land."""


def _dtype(dtype: str | None) -> str:
    name = str(dtype or "float32").removeprefix("torch.")
    return name if name in TOLERANCE else "bfloat16"  # an unknown dtype: the lenient rule


def statistic(dtype: str | None) -> str:
    """``"max"`` or ``"mean"``: what the verdict reads for an engine of ``dtype``."""
    return STATISTIC[_dtype(dtype)]


def rule_dtype(engine: str | None, actor: str | None = None) -> str:
    """The dtype whose rule judges a probe: the less precise of the engine's dtype and the
    actor's compute dtype (a bf16 actor scoring against an fp32 engine disagrees by bf16's
    rounding, not fp32's)."""
    sides = [_dtype(engine), _dtype(actor)]
    for name in ("bfloat16", "float16"):
        if name in sides:
            return name
    return "float32"


def tolerance(dtype: str | None, override: float | None = None) -> float:
    """The canary's bound on `statistic` for an engine of ``dtype`` (``override`` when
    given)."""
    if override is not None:
        return float(override)
    return TOLERANCE[_dtype(dtype)]


def mode(configured: str, dtype: str | None) -> str:
    """``trainer.sync_canary`` for an engine of ``dtype``: ``auto`` resolved by `MODE`."""
    return MODE[_dtype(dtype)] if configured == "auto" else configured


def probe_gaps(engine: torch.Tensor, actor: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """|engine - actor| log-prob of every sampled probe token (``mask`` 1) of one engine:
    ``[B, R]`` tensors, the engine's log-probs beside the actor's of the same tokens."""
    return (actor.float() - engine.float())[mask.bool()].abs()


def probe_diff(engine: torch.Tensor, actor: torch.Tensor, mask: torch.Tensor) -> float:
    """Max |engine - actor| log-prob over the probe's sampled tokens of one engine."""
    return probe_stats(engine, actor, mask)["max"]


def probe_stats(engine: torch.Tensor, actor: torch.Tensor, mask: torch.Tensor
                ) -> dict[str, float]:
    """``{"max", "mean"}`` of `probe_gaps` (NaN stays NaN: a failure, not a pass)."""
    gaps = probe_gaps(engine, actor, mask)
    if not gaps.numel():
        return {"max": 0.0, "mean": 0.0}
    if torch.isnan(gaps).any():
        return {"max": float("nan"), "mean": float("nan")}
    return {"max": float(gaps.max()), "mean": float(gaps.mean())}


def verdict(diffs: Sequence[float], bound: float, version: int, stat: str = "max"
            ) -> str | None:
    """None when every engine's ``stat`` of the gaps is within ``bound``, else the message
    naming the engines."""
    bad = [(i, d) for i, d in enumerate(diffs) if not d <= bound]  # NaN counts as bad
    if not bad:
        return None
    where = ", ".join(f"rollout worker {i}: {d:.3g}" for i, d in bad)
    return (f"weight-sync canary: after the push of policy version {version} the engine and "
            f"the actor disagree on the probe's log-probs ({stat} |diff| {where}; tolerance "
            f"{bound:g}): the engine is not running the actor's weights. Set "
            f"trainer.sync_canary=warn to go on anyway.")


def max_diff(diffs: Sequence[float]) -> float:
    return float(torch.tensor(list(diffs) or [0.0]).max())


__all__ = ["MODE", "PROBE_SEED", "PROBE_TEXTS", "PROBE_TOKENS", "STATISTIC", "TOLERANCE",
           "SyncCanaryError", "max_diff", "mode", "probe_diff", "probe_gaps", "probe_stats",
           "rule_dtype", "statistic", "tolerance", "verdict"]
