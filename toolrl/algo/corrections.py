"""Off-policy corrections: registered, composable per-token weights on the policy loss.

The tokens a step trains on were sampled by the rollout engine, not by the actor that scores
them: another kernel (vLLM's against FSDP's), another precision, a grammar that forced tokens
(``tool_choice: required`` on the gateway), or older weights (``trainer.mode`` pipeline and
async). Per sampled token the importance ratio ``rho = pi_old(y) / pi_rollout(y) =
exp(old_log_probs - rollout_log_probs)`` measures the gap. A correction bounds what the ratio
does to the loss. ``actor.loss.corrections`` lists them; with any listed, each token's loss is
multiplied by a detached weight that starts at ``rho`` and that each correction in turn
transforms (an empty list: no weight, the loss as if the samples were on-policy):

* ``tis`` (``cap``, default 2): truncated importance sampling, ``w = min(w, cap)``;
* ``mis`` (``low``/``high``, default 0.5 / 2; ``level`` ``token`` or ``sequence``): masked
  importance sampling, ``w = 0`` where the ratio leaves ``[low, high]`` (at the ``sequence``
  level the test is on the sequence's geometric-mean ratio ``exp(mean_t log rho_t)`` and
  masks the whole sequence); the weight inside the band is kept;
* ``icepop`` (``low``/``high`` = alpha / beta, default 0.5 / 5): IcePop's masking at both
  levels at once: a token whose ratio leaves ``[alpha, beta]`` gets weight 0, and so does
  every token of a sequence whose geometric-mean ratio leaves it.

Masks are 0/1 factors and ``tis`` a cap, so the result does not depend on the order of the
list: ``[tis, mis]`` caps the kept tokens at ``cap`` and drops the outliers. Every correction
reports the share of valid tokens it capped or masked (judged on the raw ratio, so the shares
do not depend on the order either); `ratio_stats` gives the ratio's distribution.

A correction of your own: ``@register_correction("name", low=..., high=...)`` on a function
``fn(weight, inputs, **params) -> (weight, {stat: tensor})``; its parameters are among
``cap``, ``low``, ``high``, ``level`` (the fields of `CorrectionConfig`), and the keyword
arguments of the decorator are their defaults. Third-party packages register through the
``toolrl.corrections`` entry-point group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from toolrl.algo.masked import masked_mean
from toolrl.registry import Registry

__all__ = [
    "CORRECTIONS",
    "LEVELS",
    "Correction",
    "CorrectionConfig",
    "CorrectionInputs",
    "apply_corrections",
    "correction_config",
    "ratio_stats",
    "register_correction",
    "resolve",
]

LEVELS = ("token", "sequence")
PARAMS = ("cap", "low", "high", "level")  # the fields a correction's parameters come from


@dataclass(frozen=True)
class CorrectionConfig:
    """One entry of ``actor.loss.corrections``: a registered correction and its parameters.

    A parameter left None takes the correction's default; one the correction does not take
    is an error (it would do nothing).
    """

    name: str = "tis"  # tis | mis | icepop | one registered with register_correction
    cap: float | None = None  # tis: the weight's upper bound (default 2.0)
    low: float | None = None  # mis / icepop: the band's lower end (default 0.5)
    high: float | None = None  # mis / icepop: the band's upper end (mis 2.0, icepop 5.0)
    level: str | None = None  # mis: test each token's ratio or its sequence's (default token)


@dataclass(frozen=True)
class CorrectionInputs:
    """What a correction reads: the token log-ratio ``log(pi_old / pi_rollout)`` (clamped),
    its exponential, and the valid-token mask, all ``[B, R]``, detached."""

    log_ratio: Tensor
    ratio: Tensor
    mask: Tensor

    def sequence_ratio(self) -> Tensor:
        """``[B, 1]``: each sequence's geometric-mean ratio over its valid tokens."""
        return masked_mean(self.log_ratio, self.mask, dim=-1).exp().unsqueeze(-1)

    def share(self, flags: Tensor) -> Tensor:
        """The share of valid tokens where ``flags`` holds."""
        return masked_mean(flags.to(self.mask.dtype), self.mask)


CorrectionFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]


@dataclass(frozen=True)
class Correction:
    """A registered correction: its function and its parameters' defaults."""

    name: str
    fn: CorrectionFn
    defaults: Mapping[str, Any]


CORRECTIONS: Registry[Correction] = Registry("correction", group="toolrl.corrections")


def register_correction(name: str, **defaults: Any) -> Callable[[CorrectionFn], CorrectionFn]:
    """Decorator: register ``fn(weight, inputs, **params)`` as the correction ``name``; the
    keyword arguments name its parameters (among `PARAMS`) and give their defaults."""
    stray = sorted(set(defaults) - set(PARAMS))
    if stray:
        raise ValueError(f"correction {name!r}: parameters must be among {list(PARAMS)}, got "
                         f"{stray}")

    def wrap(fn: CorrectionFn) -> CorrectionFn:
        CORRECTIONS.register(name)(Correction(name, fn, dict(defaults)))
        return fn

    return wrap


def correction_config(spec: CorrectionConfig | Mapping[str, Any] | str) -> CorrectionConfig:
    """A `CorrectionConfig` from itself, a mapping (``{name: tis, cap: 2}``) or a name."""
    if isinstance(spec, CorrectionConfig):
        return spec
    if isinstance(spec, str):
        return CorrectionConfig(name=spec)
    if isinstance(spec, Mapping):
        known = {f.name for f in dataclasses.fields(CorrectionConfig)}
        stray = sorted(set(spec) - known)
        if stray:
            raise ValueError(f"correction {spec.get('name')!r}: unknown keys {stray}; a "
                             f"correction takes {sorted(known)}")
        return CorrectionConfig(**spec)
    raise TypeError(f"a correction is a name, a mapping or a CorrectionConfig, got "
                    f"{type(spec).__name__}")


def resolve(spec: CorrectionConfig) -> tuple[Correction, dict[str, Any]]:
    """The registered correction of ``spec`` and its full parameters (defaults filled in);
    raises ValueError on an unknown name, a parameter it does not take, or a bad value."""
    if spec.name not in CORRECTIONS:
        raise ValueError(f"unknown correction {spec.name!r}; choose one of "
                         f"{CORRECTIONS.names()}")
    corr = CORRECTIONS.get(spec.name)
    given = {k: getattr(spec, k) for k in PARAMS if getattr(spec, k) is not None}
    stray = sorted(set(given) - set(corr.defaults))
    if stray:
        takes = ", ".join(sorted(corr.defaults)) or "no parameters"
        raise ValueError(f"correction {spec.name!r} takes {takes}; {', '.join(stray)} would "
                         f"do nothing")
    params = {**corr.defaults, **given}
    cap, low, high = params.get("cap"), params.get("low"), params.get("high")
    if cap is not None and not cap > 0:
        raise ValueError(f"correction {spec.name!r}: cap must be > 0, got {cap}")
    if low is not None and high is not None and not 0 <= low < high:
        raise ValueError(f"correction {spec.name!r}: needs 0 <= low < high, got low={low}, "
                         f"high={high}")
    if "level" in params and params["level"] not in LEVELS:
        raise ValueError(f"correction {spec.name!r}: level must be one of {list(LEVELS)}, got "
                         f"{params['level']!r}")
    return corr, params


def apply_corrections(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    mask: Tensor,
    corrections: Sequence[CorrectionConfig],
    log_ratio_clamp: float = 20.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The detached per-token weights ``[B, R]`` of ``corrections`` (applied in turn to the
    ratio ``exp(old - rollout)``, its log clamped to ``±log_ratio_clamp``) and their
    statistics (``is_weight_mean`` and each correction's shares), as 0-dim tensors."""
    if not corrections:
        raise ValueError("apply_corrections needs at least one correction")
    log_ratio = (old_log_probs - rollout_log_probs).detach().float().clamp(
        -log_ratio_clamp, log_ratio_clamp)
    m = mask.to(log_ratio.dtype)
    inputs = CorrectionInputs(log_ratio, log_ratio.exp(), m)
    weight = inputs.ratio
    stats: dict[str, Tensor] = {}
    for spec in corrections:
        corr, params = resolve(spec)
        weight, more = corr.fn(weight, inputs, **params)
        stats.update(more)
    stats["is_weight_mean"] = masked_mean(weight, m)
    return weight, stats


def ratio_stats(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor,
                log_ratio_clamp: float = 20.0) -> dict[str, float]:
    """The distribution of the ratio ``pi_old / pi_rollout`` and of ``|log pi_old - log
    pi_rollout|`` over the valid tokens of ``mask`` (mean, p99, max; the ratio's min and p1):
    empty when no token is valid."""
    valid = mask.bool()
    if not valid.any():
        return {}
    diff = (old_log_probs - rollout_log_probs).detach().float()[valid]
    ratio = diff.clamp(-log_ratio_clamp, log_ratio_clamp).exp()
    q = torch.tensor([0.01, 0.99])
    r1, r99 = torch.quantile(ratio, q).tolist()
    d99 = float(torch.quantile(diff.abs(), 0.99))
    return {"ratio_mean": float(ratio.mean()), "ratio_p1": r1, "ratio_p99": r99,
            "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max()),
            "log_prob_diff_abs_mean": float(diff.abs().mean()),
            "log_prob_diff_abs_p99": d99, "log_prob_diff_abs_max": float(diff.abs().max())}


# --- built-ins -------------------------------------------------------------------------------
@register_correction("tis", cap=2.0)
def tis(weight: Tensor, inputs: CorrectionInputs, *, cap: float
        ) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance sampling: ``min(w, cap)``; ``tis_capped``: tokens whose ratio
    is above ``cap``."""
    return weight.clamp(max=cap), {"tis_capped": inputs.share(inputs.ratio > cap)}


def _outside(r: Tensor, low: float, high: float) -> Tensor:
    return (r < low) | (r > high)


@register_correction("mis", low=0.5, high=2.0, level="token")
def mis(weight: Tensor, inputs: CorrectionInputs, *, low: float, high: float, level: str
        ) -> tuple[Tensor, dict[str, Tensor]]:
    """Masked importance sampling: weight 0 where the ratio (the token's, or at the
    ``sequence`` level its sequence's geometric mean) leaves ``[low, high]``; ``mis_masked``:
    the tokens so masked."""
    r = inputs.ratio if level == "token" else inputs.sequence_ratio()
    drop = _outside(r, low, high).expand_as(weight)
    return weight.masked_fill(drop, 0.0), {"mis_masked": inputs.share(drop)}


@register_correction("icepop", low=0.5, high=5.0)
def icepop(weight: Tensor, inputs: CorrectionInputs, *, low: float, high: float
           ) -> tuple[Tensor, dict[str, Tensor]]:
    """IcePop: weight 0 on tokens whose ratio leaves ``[low, high]`` (alpha, beta) and on
    every token of a sequence whose geometric-mean ratio leaves it. ``icepop_masked``: tokens
    masked either way; ``icepop_seq_masked``: tokens masked with their whole sequence."""
    tok = _outside(inputs.ratio, low, high)
    seq = _outside(inputs.sequence_ratio(), low, high).expand_as(weight)
    drop = tok | seq
    return weight.masked_fill(drop, 0.0), {"icepop_masked": inputs.share(drop),
                                           "icepop_seq_masked": inputs.share(seq)}
