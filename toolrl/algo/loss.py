"""Policy and value losses, loss aggregation, and log-prob/entropy math on logits.

A policy loss has the signature of `PolicyLoss` and is registered by name in `POLICY_LOSSES`
(``@register_policy_loss("name")`` or the ``toolrl.policy_losses`` entry-point group).
Built-ins: ``ppo_clip`` (PPO clip with asymmetric clip-higher and dual-clip), ``gspo``
(sequence-level ratio) and ``cispo`` (clipped, detached IS weight on a REINFORCE term). Every
one takes the off-policy corrections of `toolrl.algo.corrections` (``tis``, ``mis``,
``icepop``: detached per-token weights against the rollout engine's log-probs).
`actor_loss` adds the entropy bonus and the KL-to-reference loss term around any of them.

Aggregation and gradient accumulation: `agg_loss` reduces a ``[B, R]`` per-token loss to a
scalar. Its denominators (``total_tokens``, ``total_seqs``) can be given explicitly: pass the
counts of the *whole* mini-batch (summed over micro-batches and data-parallel ranks) and the
sum of the micro-batch losses equals the full-batch loss exactly, so accumulated gradients are
those of the full batch however it is split (see `batch_totals`). Under FSDP/DDP, which average
gradients over ranks, multiply each rank's loss by the world size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args

import torch
from torch import Tensor

from toolrl.algo.corrections import CorrectionConfig, apply_corrections, correction_config, resolve
from toolrl.algo.kl import KL_KINDS, KLKind, kl_penalty
from toolrl.algo.masked import masked_mean
from toolrl.registry import Registry

__all__ = [
    "AGG_MODES",
    "POLICY_LOSSES",
    "AggMode",
    "LossAggregator",
    "PolicyLoss",
    "PolicyLossConfig",
    "actor_loss",
    "agg_loss",
    "batch_totals",
    "entropy_from_logits",
    "log_probs_and_entropy",
    "log_probs_from_logits",
    "register_policy_loss",
    "value_loss",
]

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                  "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = get_args(AggMode)


# --- aggregation -----------------------------------------------------------------------------
def batch_totals(mask: Tensor) -> tuple[int, int]:
    """(valid tokens, sequences with at least one valid token) of ``mask [B, R]``.

    Compute these over the whole mini-batch (all-reduce them across data-parallel ranks) and
    pass them as ``total_tokens`` / ``total_seqs`` to every micro-batch's `agg_loss`.
    """
    valid = mask.bool()
    return int(valid.sum()), int(valid.any(-1).sum())


def _check_total(name: str, value: float | Tensor | None) -> None:
    if value is not None and not isinstance(value, Tensor) and not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def _denominator(total: float | Tensor) -> float | Tensor:
    """A count used as a divisor; 0 (a batch with nothing valid, numerator 0 too) becomes 1."""
    if isinstance(total, Tensor):
        return torch.where(total > 0, total, torch.ones_like(total))
    return total if total > 0 else 1.0


def agg_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    *,
    total_tokens: float | Tensor | None = None,
    total_seqs: float | Tensor | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Reduce a per-token loss ``[B, R]`` to a scalar over the valid tokens of ``mask``.

    Modes (``N`` = ``total_tokens``, default the valid tokens of ``mask``; ``S`` =
    ``total_seqs``, default the rows of ``mask`` with a valid token; padding rows never count):

    * ``token-mean``: ``sum(loss * mask) / N``. Every token weighs the same, so long responses
      weigh more (the usual choice; DAPO).
    * ``seq-mean-token-sum``: ``sum_seq(sum_tok loss) / S``.
    * ``seq-mean-token-mean``: ``sum_seq(mean_tok loss) / S`` (original GRPO; every sequence
      weighs the same, so tokens of short responses weigh more).
    * ``seq-mean-token-sum-norm``: ``sum(loss * mask) / (S * max_len)`` with a constant
      ``max_len`` (the response budget), Dr.GRPO's length-unbiased form. ``max_len`` is
      required: a per-batch length would change with padding and break accumulation.

    Every mode is a sum of per-row terms divided by a constant, so with explicit totals the sum
    over any split into micro-batches equals the full-batch value.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid modes: {', '.join(AGG_MODES)}")
    if loss_mat.shape != mask.shape:
        raise ValueError(
            f"loss {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must have the same shape"
        )
    _check_total("total_tokens", total_tokens)
    _check_total("total_seqs", total_seqs)
    m = mask.to(loss_mat.dtype)
    masked = torch.where(mask.bool(), loss_mat, torch.zeros_like(loss_mat))
    if mode == "token-mean":
        return masked.sum() / _denominator(m.sum() if total_tokens is None else total_tokens)
    seqs = _denominator(
        (m.sum(-1) > 0).sum().to(loss_mat.dtype) if total_seqs is None else total_seqs
    )
    if mode == "seq-mean-token-sum":
        return masked.sum() / seqs
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / m.sum(-1).clamp(min=1)).sum() / seqs
    if max_len is None or max_len <= 0:
        raise ValueError(
            "seq-mean-token-sum-norm needs max_len > 0: the constant response-length budget"
        )
    return masked.sum() / (seqs * max_len)


@dataclass(frozen=True)
class LossAggregator:
    """An aggregation mode plus the global denominators of the current mini-batch.

    ``LossAggregator("token-mean", total_tokens=n)(loss_mat, mask)`` is
    ``agg_loss(loss_mat, mask, "token-mean", total_tokens=n)``. Build one per mini-batch
    from `batch_totals` of the whole mini-batch and reuse it for each micro-batch.
    """

    mode: str = "token-mean"
    total_tokens: float | Tensor | None = None
    total_seqs: float | Tensor | None = None
    max_len: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in AGG_MODES:
            raise ValueError(
                f"unknown loss_agg_mode {self.mode!r}; valid modes: {', '.join(AGG_MODES)}"
            )
        if self.mode == "seq-mean-token-sum-norm" and not (self.max_len and self.max_len > 0):
            raise ValueError("seq-mean-token-sum-norm needs max_len > 0 (the response budget)")
        _check_total("total_tokens", self.total_tokens)
        _check_total("total_seqs", self.total_seqs)

    def __call__(self, loss_mat: Tensor, mask: Tensor) -> Tensor:
        return agg_loss(
            loss_mat, mask, self.mode, total_tokens=self.total_tokens,
            total_seqs=self.total_seqs, max_len=self.max_len,
        )


# --- config ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicyLossConfig:
    """Hyper-parameters of the actor's loss (validated on construction).

    * ``clip_ratio_low`` / ``clip_ratio_high``: the ratio is clipped to ``[1 - low, 1 + high]``;
      ``high > low`` is DAPO's clip-higher (e.g. 0.2 / 0.28).
    * ``clip_ratio_c``: dual-clip bound for negative advantages (the loss of a token with
      ``A < 0`` is at most ``-A * c``); None disables. Must be > 1.
    * ``corrections``: off-policy corrections against the rollout engine's log-probs
      (`toolrl.algo.corrections`: ``tis``, ``mis``, ``icepop`` or registered ones, each a
      `CorrectionConfig`, a mapping or a name); each token's loss is multiplied by the
      detached weight they make of ``exp(old_log_probs - rollout_log_probs)``. Empty: none.
    * ``loss_agg_mode``: how token losses become the loss (see `agg_loss`): ``token-mean``,
      ``seq-mean-token-sum``, ``seq-mean-token-mean`` (original GRPO),
      ``seq-mean-token-sum-norm`` (Dr.GRPO). ``entropy_coeff``: entropy bonus weight.
      ``kl_loss_coef`` / ``kl_loss_kind``: KL-to-reference loss term (see `toolrl.algo.kl`).
    * ``policy_loss``: name in `POLICY_LOSSES` used by `actor_loss` (``ppo_clip``, ``gspo``,
      ``cispo``, or one registered with `register_policy_loss`).
    * ``log_ratio_clamp``: ``log(new/old)`` is clamped to ``±log_ratio_clamp`` before exp.
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float | None = 3.0
    corrections: list[CorrectionConfig] = field(default_factory=list)
    loss_agg_mode: AggMode = "token-mean"
    entropy_coeff: float = 0.0
    kl_loss_coef: float = 0.0
    kl_loss_kind: KLKind = "k3"
    policy_loss: str = "ppo_clip"
    log_ratio_clamp: float = 20.0

    def __post_init__(self) -> None:
        if self.loss_agg_mode not in AGG_MODES:
            raise ValueError(
                f"unknown loss_agg_mode {self.loss_agg_mode!r}; valid modes: "
                f"{', '.join(AGG_MODES)}"
            )
        if self.kl_loss_kind not in KL_KINDS:
            raise ValueError(
                f"unknown kl_loss_kind {self.kl_loss_kind!r}; valid kinds: {', '.join(KL_KINDS)}"
            )
        if not 0.0 <= self.clip_ratio_low <= 1.0:
            raise ValueError(f"clip_ratio_low must be in [0, 1], got {self.clip_ratio_low}")
        if not self.clip_ratio_high >= 0.0:
            raise ValueError(f"clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1.0:
            raise ValueError(
                f"clip_ratio_c (dual-clip) must be > 1 or None, got {self.clip_ratio_c}"
            )
        specs = [correction_config(c) for c in self.corrections]
        for i, spec in enumerate(specs):
            try:
                resolve(spec)  # unknown name, a parameter it does not take, a bad value
            except ValueError as exc:  # name the entry: the config pass keys it
                raise ValueError(f"corrections[{i}]: {exc}") from None
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"corrections lists one correction twice: {names}")
        object.__setattr__(self, "corrections", specs)
        if not math.isfinite(self.entropy_coeff):
            raise ValueError(f"entropy_coeff must be finite, got {self.entropy_coeff}")
        if not self.kl_loss_coef >= 0.0:
            raise ValueError(f"kl_loss_coef must be >= 0, got {self.kl_loss_coef}")
        if not self.log_ratio_clamp > 0.0:
            raise ValueError(f"log_ratio_clamp must be > 0, got {self.log_ratio_clamp}")
        if not isinstance(self.policy_loss, str) or not self.policy_loss:
            raise ValueError(f"policy_loss must be a registered name, got {self.policy_loss!r}")


# --- policy losses ---------------------------------------------------------------------------
class PolicyLoss(Protocol):
    """``fn(log_probs, old_log_probs, advantages, response_mask, *, config, rollout_log_probs,
    agg) -> (scalar loss, metrics)``; all tensors ``[B, R]``, metrics plain floats."""

    def __call__(
        self,
        log_probs: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        *,
        config: PolicyLossConfig,
        rollout_log_probs: Tensor | None = None,
        agg: LossAggregator,
    ) -> tuple[Tensor, dict[str, float]]: ...


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", group="toolrl.policy_losses")


def register_policy_loss(name: str):
    """Decorator: register a `PolicyLoss` under ``name``."""
    return POLICY_LOSSES.register(name)


def _check_inputs(name: str, log_probs: Tensor, *others: Tensor | None) -> None:
    for t in others:
        if t is not None and t.shape != log_probs.shape:
            raise ValueError(
                f"{name}: every input must have the shape of log_probs {tuple(log_probs.shape)}, "
                f"got {tuple(t.shape)}"
            )


def _correction_weights(
    old_log_probs: Tensor, rollout_log_probs: Tensor | None, mask: Tensor,
    config: PolicyLossConfig,
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """Detached per-token weights of ``config.corrections`` and their statistics (None and
    nothing without corrections)."""
    if not config.corrections:
        return None, {}
    if rollout_log_probs is None:
        raise ValueError("actor.loss.corrections are set: pass rollout_log_probs (the "
                         "inference engine's)")
    return apply_corrections(old_log_probs, rollout_log_probs, mask, config.corrections,
                             config.log_ratio_clamp)


def _finish(
    pg_losses: Tensor,
    mask: Tensor,
    agg: LossAggregator,
    weights: tuple[Tensor | None, dict[str, Tensor]],
    stats: dict[str, Tensor],
) -> tuple[Tensor, dict[str, float]]:
    """Apply the corrections' weights, aggregate, and turn the statistics into floats with
    one sync."""
    m = mask.to(pg_losses.dtype)
    w, corr_stats = weights
    if w is not None:
        pg_losses = pg_losses * w.to(pg_losses.dtype)
        stats.update(corr_stats)
    loss = agg(pg_losses, mask)
    stats["pg_loss"] = loss.detach()
    stats["tokens"] = m.sum()
    keys = list(stats)
    values = torch.stack([stats[k].detach().to(torch.float64).reshape(()) for k in keys]).tolist()
    return loss, dict(zip(keys, values, strict=True))


def _ratio_stats(log_ratio: Tensor, ratio: Tensor, m: Tensor) -> dict[str, Tensor]:
    """Drift between the old and new policy: k1/k3 estimates of KL(old || new), ratio range."""
    has = m.sum() > 0
    r_masked = torch.where(m > 0, ratio.detach(), torch.full_like(ratio, -torch.inf))
    ratio_max = torch.where(has, r_masked.max(), ratio.new_zeros(()))
    lr = log_ratio.detach()
    return {
        "ppo_kl_k1": masked_mean(-lr, m),
        "ppo_kl_k3": masked_mean(ratio.detach() - 1 - lr, m),
        "ratio_mean": masked_mean(ratio.detach(), m),
        "ratio_max": ratio_max,
    }


def _token_ratio(log_probs: Tensor, old_log_probs: Tensor, config: PolicyLossConfig
                 ) -> tuple[Tensor, Tensor]:
    """The per-token log-ratio (clamped to +-``log_ratio_clamp``) and the ratio."""
    log_ratio = (log_probs - old_log_probs).clamp(-config.log_ratio_clamp, config.log_ratio_clamp)
    return log_ratio, log_ratio.exp()


def _clip_stats(r: Tensor, lo: float, hi: float, m: Tensor, adv: Tensor | None = None
                ) -> dict[str, Tensor]:
    """Shares of valid tokens clipped above (``r > hi``) and below (``r < lo``): with ``adv``
    only where the clip binds (PPO: above for A > 0, below for A < 0)."""
    upper, lower = r > hi, r < lo
    if adv is not None:
        upper, lower = (adv > 0) & upper, (adv < 0) & lower
    return {"pg_clipfrac": masked_mean((upper | lower).to(m.dtype), m),
            "pg_clipfrac_upper": masked_mean(upper.to(m.dtype), m),
            "pg_clipfrac_lower": masked_mean(lower.to(m.dtype), m)}


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: PolicyLossConfig,
    rollout_log_probs: Tensor | None = None,
    agg: LossAggregator,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with clip-higher and dual-clip.

    ``r = exp(log_probs - old_log_probs)``; per token
    ``L = max(-A * r, -A * clip(r, 1 - low, 1 + high))``, and for ``A < 0`` with dual-clip
    ``L = min(L, -A * c)``. Clipped tokens have zero gradient. Metrics: ``pg_clipfrac``
    (``_upper``: A > 0 and r > 1 + high; ``_lower``: A < 0 and r < 1 - low),
    ``pg_dualclip_frac`` (A < 0 and r > c), ``ppo_kl_k1`` / ``ppo_kl_k3``, ``ratio_mean`` /
    ``ratio_max``, with corrections ``is_weight_mean`` and each one's shares (``tis_capped``,
    ``mis_masked``, ``icepop_masked``...), ``pg_loss``, ``tokens``.
    """
    _check_inputs("ppo_clip", log_probs, old_log_probs, advantages, response_mask,
                  rollout_log_probs)
    m = response_mask.to(log_probs.dtype)
    adv = advantages.to(log_probs.dtype)
    log_ratio, ratio = _token_ratio(log_probs, old_log_probs, config)
    lo, hi = 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(lo, hi)
    pg_losses = torch.maximum(unclipped, clipped)
    r = ratio.detach()
    stats = _clip_stats(r, lo, hi, m, adv)
    if config.clip_ratio_c is not None:
        dual = torch.minimum(pg_losses, -adv * config.clip_ratio_c)
        pg_losses = torch.where(adv < 0, dual, pg_losses)
        stats["pg_dualclip_frac"] = masked_mean(((adv < 0) & (r > config.clip_ratio_c)).to(m.dtype),
                                                m)
    stats.update(_ratio_stats(log_ratio, ratio, m))
    weights = _correction_weights(old_log_probs, rollout_log_probs, response_mask, config)
    return _finish(pg_losses, response_mask, agg, weights, stats)


@register_policy_loss("gspo")
def gspo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: PolicyLossConfig,
    rollout_log_probs: Tensor | None = None,
    agg: LossAggregator,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO: PPO clipping on the sequence-level ratio ``s = exp(mean_t log(new/old))``.

    Token ratios are ``sg(s) * p / sg(p)``: equal to ``s`` in value, each token's gradient
    flowing through its own log-prob. The clip ranges are those of the config (GSPO uses
    small ones, e.g. 3e-4 / 4e-4); dual-clip is not applied. Use sequence-level advantages and
    ``seq-mean-token-mean`` aggregation as in the paper.
    """
    _check_inputs("gspo", log_probs, old_log_probs, advantages, response_mask, rollout_log_probs)
    m = response_mask.to(log_probs.dtype)
    adv = advantages.to(log_probs.dtype)
    seq_log_ratio = masked_mean(log_probs - old_log_probs, m, dim=-1)
    log_ratio = seq_log_ratio.detach()[:, None] + log_probs - log_probs.detach()
    log_ratio = log_ratio.clamp(max=config.log_ratio_clamp)
    ratio = log_ratio.exp()
    lo, hi = 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high
    pg_losses = torch.maximum(-adv * ratio, -adv * ratio.clamp(lo, hi))
    stats = _clip_stats(ratio.detach(), lo, hi, m, adv)
    tok_log_ratio = (log_probs - old_log_probs).detach()
    stats.update(_ratio_stats(tok_log_ratio, tok_log_ratio.exp(), m))
    weights = _correction_weights(old_log_probs, rollout_log_probs, response_mask, config)
    return _finish(pg_losses, response_mask, agg, weights, stats)


@register_policy_loss("cispo")
def cispo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: PolicyLossConfig,
    rollout_log_probs: Tensor | None = None,
    agg: LossAggregator,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO: ``L = -sg(clip(r, 1 - low, 1 + high)) * A * log_probs``.

    The IS weight is clipped and detached, so unlike PPO no token's gradient is dropped; only
    its weight is bounded. MiniMax-M1 clips from above only: set ``clip_ratio_low=1.0``.
    """
    _check_inputs("cispo", log_probs, old_log_probs, advantages, response_mask,
                  rollout_log_probs)
    m = response_mask.to(log_probs.dtype)
    adv = advantages.to(log_probs.dtype)
    log_ratio, ratio = _token_ratio(log_probs, old_log_probs, config)
    lo, hi = 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high
    weight = ratio.detach().clamp(lo, hi)
    pg_losses = -weight * adv * log_probs
    stats = _clip_stats(ratio.detach(), lo, hi, m)
    stats.update(_ratio_stats(log_ratio, ratio, m))
    weights = _correction_weights(old_log_probs, rollout_log_probs, response_mask, config)
    return _finish(pg_losses, response_mask, agg, weights, stats)


def actor_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: LossAggregator,
    entropy: Tensor | None = None,
    ref_log_probs: Tensor | None = None,
    rollout_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The full actor objective: ``pg_loss - entropy_coeff * H + kl_loss_coef * KL(ref)``.

    The policy loss is ``POLICY_LOSSES[config.policy_loss]``; entropy and KL use the same
    aggregator, so the whole loss accumulates exactly over micro-batches. ``entropy`` is
    required when ``entropy_coeff != 0`` and ``ref_log_probs`` when ``kl_loss_coef > 0``.

    Metrics: ``loss`` and ``pg_loss`` are this call's aggregated values (with global totals,
    sum them over micro-batches); the rest (``entropy``, ``kl_ref``, clip fractions, ratios)
    are means over this call's valid tokens (average them weighted by ``tokens``), except
    ``ratio_max``.
    """
    fn = POLICY_LOSSES.get(config.policy_loss)
    loss, metrics = fn(
        log_probs, old_log_probs, advantages, response_mask,
        config=config, rollout_log_probs=rollout_log_probs, agg=agg,
    )
    m = response_mask.to(log_probs.dtype)
    if config.entropy_coeff != 0.0 and entropy is None:
        raise ValueError("entropy_coeff != 0: pass the per-token entropy")
    if entropy is not None:
        if config.entropy_coeff != 0.0:
            loss = loss - config.entropy_coeff * agg(entropy, response_mask)
        metrics["entropy"] = float(masked_mean(entropy.detach(), m))
    if config.kl_loss_coef > 0.0:
        if ref_log_probs is None:
            raise ValueError("kl_loss_coef > 0: pass ref_log_probs")
        kl = kl_penalty(log_probs, ref_log_probs, config.kl_loss_kind)
        loss = loss + config.kl_loss_coef * agg(kl, response_mask)
        metrics["kl_ref"] = float(masked_mean(kl.detach(), m))
    metrics["loss"] = float(loss.detach())
    return loss, metrics


# --- critic ----------------------------------------------------------------------------------
def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_range_value: float | None,
    agg: LossAggregator,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped value loss: ``0.5 * max((V - G)^2, (V_old + clip(V - V_old, ±c) - G)^2)``.

    ``clip_range_value=None`` gives the plain squared error. Metrics: ``vf_loss`` (aggregated
    value), ``vf_clipfrac`` (share of tokens where the clipped term is the larger),
    ``vpred_mean``, ``tokens``.
    """
    _check_inputs("value_loss", values, old_values, returns, mask)
    m = mask.to(values.dtype)
    err = (values - returns).square()
    if clip_range_value is None:
        losses = 0.5 * err
        clipfrac = values.new_zeros(())
    else:
        if not clip_range_value > 0:
            raise ValueError(f"clip_range_value must be > 0 or None, got {clip_range_value}")
        v_clipped = old_values + (values - old_values).clamp(-clip_range_value, clip_range_value)
        err_clipped = (v_clipped - returns).square()
        losses = 0.5 * torch.maximum(err, err_clipped)
        clipfrac = masked_mean((err_clipped > err).to(m.dtype), m)
    loss = agg(losses, mask)
    stats = torch.stack([
        loss.detach(), clipfrac.detach(), masked_mean(values.detach(), m), m.sum()
    ]).tolist()
    return loss, dict(zip(("vf_loss", "vf_clipfrac", "vpred_mean", "tokens"), stats, strict=True))


# --- logits ----------------------------------------------------------------------------------
_LOW_PRECISION_CHUNK = 1024  # rows upcast to float32 at a time for bf16/fp16 logits


def log_probs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """``log softmax(logits)[labels]`` without materializing the full log-softmax.

    ``logits [..., V]``, ``labels [...]`` -> float32 ``[...]``, computed as
    ``logits.gather(labels) - logsumexp(logits)``. float32/float64 logits are used in place;
    bf16/fp16 logits (whose logsumexp is too coarse in their own precision) are upcast to
    float32 a chunk of rows at a time. The result is exact up to float32 rounding at the
    logits' magnitude. Divide the logits by the sampling temperature first if they must match
    the engine's log-probs.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels {tuple(labels.shape)} must match logits {tuple(logits.shape)} without "
            f"the vocab dim"
        )
    labels = labels.long()
    if logits.dtype in (torch.float32, torch.float64):
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return (picked - torch.logsumexp(logits, dim=-1)).float()
    flat = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1)
    out = []
    for start in range(0, flat.shape[0], _LOW_PRECISION_CHUNK):
        rows = flat[start : start + _LOW_PRECISION_CHUNK].float()
        lab = flat_labels[start : start + _LOW_PRECISION_CHUNK]
        picked = rows.gather(-1, lab.unsqueeze(-1)).squeeze(-1)
        out.append(picked - torch.logsumexp(rows, dim=-1))
    if not out:
        return torch.zeros(labels.shape, dtype=torch.float32, device=logits.device)
    return torch.cat(out).reshape(labels.shape)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of ``softmax(logits)`` over the last dim, in float32.

    Computed from max-shifted logits ``z`` as ``log(sum e^z) - sum(e^z * z) / sum(e^z)``, which
    stays accurate for large logits; ``-inf`` logits (masked vocabulary entries) contribute 0.
    """
    z = logits.float()
    z = z - z.amax(dim=-1, keepdim=True).detach()
    e = z.exp()
    s = e.sum(-1)
    return s.log() - (e * z).nansum(-1) / s


def log_probs_and_entropy(logits: Tensor, labels: Tensor, entropy_grad: bool = True
                          ) -> tuple[Tensor, Tensor]:
    """``log softmax(logits)[labels]`` and the entropy of ``softmax(logits)`` from one
    logsumexp, in float32 (``logits [..., V]``, ``labels [...]``).

    ``H = lse - sum(softmax * z)``; ``-inf`` logits contribute 0. With ``entropy_grad=False``
    the entropy is computed without autograd (a metric), the log-probs keep their gradient.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels {tuple(labels.shape)} must match logits {tuple(logits.shape)} without "
            f"the vocab dim"
        )
    z = logits.float()
    lse = torch.logsumexp(z, dim=-1)
    log_probs = z.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1) - lse
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        zz, ll = (z, lse) if entropy_grad else (z.detach(), lse.detach())
        entropy = ll - torch.nansum(torch.exp(zz - ll.unsqueeze(-1)) * zz, dim=-1)
    return log_probs, entropy
