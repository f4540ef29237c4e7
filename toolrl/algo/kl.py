"""KL divergence to the reference policy, estimated per token from sampled log-probs.

With ``x = log p(a) - log ref(a)`` for a token ``a`` sampled from the policy p:

* ``k1 = x``: unbiased for KL(p || ref), high variance, can be negative per token.
* ``k2 = x**2 / 2``: biased, low variance, always >= 0; its gradient is that of KL to first
  order.
* ``k3 = exp(-x) + x - 1`` (i.e. ``ref/p - log(ref/p) - 1``): unbiased and always >= 0 (the
  "low-variance KL" of Schulman's note and verl's ``low_var_kl``).
* ``abs = |x|``.

Use them as a loss term (`toolrl.algo.loss.actor_loss` with ``kl_loss_coef``) or subtract them
from the reward (`apply_kl_in_reward`).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from toolrl.algo.masked import masked_mean

__all__ = ["K3_CLAMP", "K3_LOG_RATIO_CLAMP", "KL_KINDS", "KLKind", "apply_kl_in_reward",
           "kl_penalty"]

KLKind = Literal["k1", "k2", "k3", "abs"]
KL_KINDS: tuple[str, ...] = get_args(KLKind)
K3_LOG_RATIO_CLAMP = 20.0  # |log(ref/p)| bound before exp: exp(20) ~ 4.9e8 stays finite
K3_CLAMP = 10.0  # upper bound of the per-token k3 value


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate of ``kind`` (one of `KL_KINDS`), same shape as the inputs.

    ``k3`` is clamped for stability as in verl: the log-ratio ``log(ref/p)`` is clamped to
    ``[-20, 20]`` before the exponential (so a token the reference finds ~impossible or
    near-certain cannot overflow), and the result to at most 10. Both clamps only act on
    outlier tokens, whose gradient they zero: one token far from the reference cannot dominate
    the step. The other kinds are unclamped.
    """
    if log_probs.shape != ref_log_probs.shape:
        raise ValueError(
            f"log_probs {tuple(log_probs.shape)} and ref_log_probs "
            f"{tuple(ref_log_probs.shape)} must have the same shape"
        )
    x = log_probs - ref_log_probs
    if kind == "k1":
        return x
    if kind == "k2":
        return 0.5 * x.square()
    if kind == "k3":
        neg = (-x).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        return (torch.exp(neg) - neg - 1).clamp(max=K3_CLAMP)
    if kind == "abs":
        return x.abs()
    raise ValueError(f"unknown KL kind {kind!r}; valid kinds: {', '.join(KL_KINDS)}")


@torch.no_grad()
def apply_kl_in_reward(
    token_level_scores: Tensor,
    log_probs: Tensor,
    ref_log_probs: Tensor,
    response_mask: Tensor,
    coef: float,
    kind: str = "k1",
) -> tuple[Tensor, dict[str, float]]:
    """``rewards = scores - coef * KL`` on valid tokens (the classic RLHF in-reward penalty).

    Returns ``(token_level_rewards, metrics)`` with metrics ``kl`` (mean per valid token),
    ``kl_seq`` (mean over sequences of the per-sequence KL sum) and ``kl_coef``. The KL is
    computed without gradients: in the reward it is a fixed signal, not a loss term.
    """
    if coef < 0:
        raise ValueError(f"kl coef must be >= 0, got {coef}")
    if token_level_scores.shape != response_mask.shape:
        raise ValueError(
            f"token_level_scores {tuple(token_level_scores.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must have the same shape"
        )
    kl = kl_penalty(log_probs, ref_log_probs, kind)
    m = response_mask.to(kl.dtype)
    kl = kl * m
    scores = token_level_scores if token_level_scores.is_floating_point() else (
        token_level_scores.float()
    )
    rewards = scores - coef * kl.to(scores.dtype)
    has_tokens = m.sum(-1) > 0
    metrics = {
        "kl": float(masked_mean(kl, m)),
        "kl_seq": float(masked_mean(kl.sum(-1), has_tokens)),
        "kl_coef": float(coef),
    }
    return rewards, metrics
