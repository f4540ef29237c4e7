"""Advantage estimators: pure functions ``[B, R]`` rewards -> ``[B, R]`` advantages and returns.

Every estimator has the signature of `AdvantageEstimator` and is registered by name in
`ADVANTAGE_ESTIMATORS`; `compute_advantage("grpo", ...)` looks one up and calls it. Add your own
with `@register_advantage("name")` (or an entry point in the ``toolrl.advantages`` group).

Conventions shared by all built-ins:

* ``token_level_rewards[b, t]`` is the reward received after token ``t``. The rollout puts an
  outcome reward on the last sampled token and a per-turn reward on the last sampled token of
  that turn; an in-reward KL penalty lands on every sampled token.
* ``response_mask`` is 1 on tokens the policy sampled. In multi-turn episodes it has *holes*:
  tool-observation tokens inside the response are 0. Estimators that look along time (GAE,
  REINFORCE++ return-to-go, per-turn GRPO) treat consecutive **valid** tokens as consecutive
  time steps: observation tokens are not actions, so they neither discount nor cut the return.
  A reward that sits on a masked position is credited to the nearest valid token before it (to
  the first valid token when none precedes it).
* Outcome estimators (GRPO, Dr.GRPO, RLOO) use the sequence return ``sum_t
  token_level_rewards[b, t]`` over the whole row and give it to every valid token.
* Group estimators take ``uids`` (one hashable per row; rows of one prompt share it). A group
  of size 1 has no baseline to compare with: its advantage is 0.
* Advantages and returns are exactly 0 outside the mask, computed without gradients, and have
  the dtype of the rewards (float32 for integer rewards).
* ``returns`` is the un-normalized quantity the advantage is built from (the outcome, the
  return-to-go, or GAE's critic target), useful as a metric and as the critic's target.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from toolrl.algo.masked import masked_whiten
from toolrl.registry import Registry

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "compute_advantage",
    "register_advantage",
    "uniform_groups",
]

Uids = Sequence[Hashable] | Tensor


class AdvantageEstimator(Protocol):
    """``fn(token_level_rewards, response_mask, *, uids, values, gamma, lam, eps, **kw)``.

    Returns ``(advantages, returns)``, both ``[B, R]`` and zero outside ``response_mask``.
    Estimators must accept and ignore keyword arguments they do not use, so the trainer can
    pass one uniform set.
    """

    def __call__(
        self,
        token_level_rewards: Tensor,
        response_mask: Tensor,
        *,
        uids: Uids | None = None,
        values: Tensor | None = None,
        gamma: float = 1.0,
        lam: float = 1.0,
        eps: float = 1e-6,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor]: ...


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage estimator", group="toolrl.advantages"
)


def register_advantage(name: str):
    """Decorator: register an `AdvantageEstimator` under ``name``."""
    return ADVANTAGE_ESTIMATORS.register(name)


def compute_advantage(
    name: str, token_level_rewards: Tensor, response_mask: Tensor, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """Look up the estimator ``name`` and apply it."""
    return ADVANTAGE_ESTIMATORS.get(name)(token_level_rewards, response_mask, **kwargs)


# --- helpers ---------------------------------------------------------------------------------
def _prepare(
    name: str, rewards: Tensor, mask: Tensor, values: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Validate shapes; return (float rewards, bool mask, float mask)."""
    if rewards.dim() != 2:
        raise ValueError(f"{name}: token_level_rewards must be [B, R], got {tuple(rewards.shape)}")
    if mask.shape != rewards.shape:
        raise ValueError(
            f"{name}: response_mask {tuple(mask.shape)} must match token_level_rewards "
            f"{tuple(rewards.shape)}"
        )
    if values is not None and values.shape != rewards.shape:
        raise ValueError(
            f"{name}: values {tuple(values.shape)} must match token_level_rewards "
            f"{tuple(rewards.shape)}"
        )
    if not rewards.is_floating_point():
        rewards = rewards.float()
    valid = mask.bool()
    return rewards, valid, valid.to(rewards.dtype)


def _group_index(name: str, uids: Uids | None, batch_size: int, device: torch.device) -> Tensor:
    """Map uids to consecutive group ids ``[B]`` (order of first appearance)."""
    if uids is None:
        raise ValueError(f"{name} groups samples by prompt: pass uids (one per row)")
    keys = uids.tolist() if isinstance(uids, Tensor) else list(uids)
    if len(keys) != batch_size:
        raise ValueError(f"{name}: got {len(keys)} uids for {batch_size} rows")
    table: dict[Hashable, int] = {}
    ids = [table.setdefault(k, len(table)) for k in keys]
    return torch.tensor(ids, dtype=torch.long, device=device)


def _compact_index(valid: Tensor) -> tuple[Tensor, int]:
    """Step index of each position: the number of valid tokens before it (holes inherit the
    previous valid token's index; leading holes get 0). Returns (index [B, R], width)."""
    owner = (valid.long().cumsum(-1) - 1).clamp(min=0)
    width = max(int(valid.sum(-1).max()), 1) if valid.numel() else 1
    return owner, width


def _turn_index(valid: Tensor) -> tuple[Tensor, Tensor, int]:
    """Turn index of each position (a turn is a maximal run of valid tokens; holes inherit the
    previous turn). Returns (index [B, R], turns per row [B], width)."""
    prev = torch.zeros_like(valid)
    prev[:, 1:] = valid[:, :-1]
    starts = valid & ~prev
    owner = (starts.long().cumsum(-1) - 1).clamp(min=0)
    turns = starts.sum(-1)
    width = max(int(turns.max()), 1) if valid.numel() else 1
    return owner, turns, width


def _scatter_steps(x: Tensor, owner: Tensor, width: int) -> Tensor:
    """Sum ``x [B, R]`` into compact steps ``[B, width]``."""
    return torch.zeros(x.shape[0], width, dtype=x.dtype, device=x.device).scatter_add_(1, owner, x)


def _gather_steps(c: Tensor, owner: Tensor, maskf: Tensor) -> Tensor:
    """Spread compact step values back onto positions, zero outside the mask."""
    return c.gather(1, owner) * maskf


def _discounted(r: Tensor, gamma: float) -> Tensor:
    """Return-to-go ``G_k = r_k + gamma * G_{k+1}`` along dim 1 (zero after the last step)."""
    if gamma == 1.0:
        return r.flip(1).cumsum(1).flip(1)
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for k in range(r.shape[1] - 1, -1, -1):
        running = r[:, k] + gamma * running
        out[:, k] = running
    return out


def _group_normalize(
    g: Tensor,
    steps: Tensor,
    group: Tensor,
    *,
    norm_by_std: bool,
    unbiased: bool,
    eps: float,
) -> Tensor:
    """Normalize per-step returns ``g [B, W]`` within groups.

    Each sample has weight 1 in the group statistics, shared equally by its ``steps[b]`` steps
    (at least 1): the group mean is the mean over samples of each sample's step-mean, and the
    variance sums each sample's step-averaged squared deviation. With one step per sample this
    is exactly GRPO's mean and (unbiased) std. Groups of one sample get 0.
    """
    b, w = g.shape
    n_groups = int(group.max()) + 1 if b else 0
    n_steps = steps.clamp(min=1).to(g.dtype)
    smask = (torch.arange(w, device=g.device)[None, :] < n_steps[:, None]).to(g.dtype)
    g64 = g.double()
    sample_mean = (g64 * smask).sum(1) / n_steps
    count = torch.zeros(n_groups, dtype=torch.float64, device=g.device).index_add_(
        0, group, torch.ones(b, dtype=torch.float64, device=g.device)
    )
    mean = torch.zeros_like(count).index_add_(0, group, sample_mean) / count
    centred = g64 - mean[group][:, None]
    if norm_by_std:
        sq = ((centred**2) * smask).sum(1) / n_steps
        ss = torch.zeros_like(count).index_add_(0, group, sq)
        var = ss / (count - 1).clamp(min=1) if unbiased else ss / count
        centred = centred / (var.sqrt()[group][:, None] + eps)
    lone = (count[group] < 2)[:, None]
    return torch.where(lone, torch.zeros_like(centred), centred).to(g.dtype)


def _group_mean(x: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row group mean and group size of ``x [B]``."""
    n_groups = int(group.max()) + 1 if x.numel() else 0
    x64 = x.double()
    count = torch.zeros(n_groups, dtype=torch.float64, device=x.device).index_add_(
        0, group, torch.ones_like(x64)
    )
    total = torch.zeros_like(count).index_add_(0, group, x64)
    return (total / count)[group].to(x.dtype), count[group].to(x.dtype)


def uniform_groups(scores: Tensor, uids: Uids, atol: float = 1e-6) -> Tensor:
    """``[B]`` bool: rows whose group's scores are all equal (within ``atol``).

    Group estimators give such a group zero advantage (nothing to prefer within it), so its
    samples carry no policy gradient; DAPO drops them before the update. A group of one sample
    counts as uniform.
    """
    group = _group_index("uniform_groups", uids, scores.shape[0], scores.device)
    n = int(group.max()) + 1 if scores.numel() else 0
    x = scores.double()
    high = torch.full((n,), -torch.inf, dtype=x.dtype, device=x.device).scatter_reduce(
        0, group, x, "amax")
    low = torch.full((n,), torch.inf, dtype=x.dtype, device=x.device).scatter_reduce(
        0, group, x, "amin")
    return ((high - low) <= atol)[group]


# --- outcome estimators ----------------------------------------------------------------------
@register_advantage("grpo")
@torch.no_grad()
def grpo_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    uids: Uids | None = None,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    unbiased_std: bool = True,
    **_: Any,
) -> tuple[Tensor, Tensor]:
    """GRPO: ``A_i = (R_i - mean_g R) / (std_g R + eps)`` on every valid token of sample i.

    ``R_i`` is the sum of the row's rewards. ``std`` is the unbiased (Bessel-corrected) sample
    std by default, as ``torch.std`` and the reference implementations use; pass
    ``unbiased_std=False`` for the population std. A group whose rewards are all equal gets 0.
    ``norm_by_std=False`` is Dr.GRPO. Returns ``(advantages, R_i on valid tokens)``.
    """
    rewards, _, maskf = _prepare("grpo", token_level_rewards, response_mask)
    group = _group_index("grpo", uids, rewards.shape[0], rewards.device)
    score = rewards.sum(-1, keepdim=True)
    adv = _group_normalize(
        score, torch.ones_like(group), group, norm_by_std=norm_by_std, unbiased=unbiased_std,
        eps=eps,
    )
    return adv * maskf, score * maskf


@register_advantage("dr_grpo")
@torch.no_grad()
def dr_grpo_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, *, uids: Uids | None = None, **_: Any
) -> tuple[Tensor, Tensor]:
    """Dr.GRPO: ``A_i = R_i - mean_g R`` (no std normalization, which up-weights easy and hard
    prompts). Pair it with the ``seq-mean-token-sum-norm`` loss aggregation to also remove the
    length normalization, as the Dr.GRPO paper does."""
    return grpo_advantage(token_level_rewards, response_mask, uids=uids, norm_by_std=False)


@register_advantage("rloo")
@torch.no_grad()
def rloo_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, *, uids: Uids | None = None, **_: Any
) -> tuple[Tensor, Tensor]:
    """RLOO: ``A_i = R_i - mean_{j != i in group} R_j`` (leave-one-out baseline, unbiased).

    Equals ``n/(n-1) * (R_i - mean_g R)``. Groups of one sample get 0.
    """
    rewards, _, maskf = _prepare("rloo", token_level_rewards, response_mask)
    group = _group_index("rloo", uids, rewards.shape[0], rewards.device)
    score = rewards.sum(-1)
    mean, count = _group_mean(score, group)
    others = (mean * count - score) / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, score - others, torch.zeros_like(score))
    return adv[:, None] * maskf, score[:, None] * maskf


# --- return-to-go estimators -----------------------------------------------------------------
def _return_to_go(rewards: Tensor, valid: Tensor, maskf: Tensor, gamma: float):
    """Discounted return-to-go over valid tokens; returns (G [B,R], G_c [B,W], owner)."""
    owner, width = _compact_index(valid)
    g_c = _discounted(_scatter_steps(rewards, owner, width), gamma)
    return _gather_steps(g_c, owner, maskf), g_c, owner


@register_advantage("reinforce_pp")
@torch.no_grad()
def reinforce_pp_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    gamma: float = 1.0,
    eps: float = 1e-6,
    **_: Any,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: per-token discounted return-to-go, whitened over the batch's valid tokens.

    ``G_t = sum_{k >= t} gamma^(k - t) r_k`` where k runs over valid tokens only (observation
    tokens in a multi-turn response are skipped, not treated as episode ends). Advantages are
    ``(G - mean) / (std + eps)`` with mean/unbiased std over every valid token in the batch.
    Returns ``(advantages, G)``.
    """
    rewards, valid, maskf = _prepare("reinforce_pp", token_level_rewards, response_mask)
    returns, _, _ = _return_to_go(rewards, valid, maskf, gamma)
    return masked_whiten(returns, maskf, eps=eps), returns


@register_advantage("reinforce_pp_baseline")
@torch.no_grad()
def reinforce_pp_baseline_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    uids: Uids | None = None,
    gamma: float = 1.0,
    eps: float = 1e-6,
    **_: Any,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group baseline: ``A_t = whiten(G_t - mean_g G_0)``.

    ``G_t`` is the return-to-go of `reinforce_pp`, ``G_0`` the whole sequence's return; the
    group mean of ``G_0`` is subtracted before whitening over the batch's valid tokens. With an
    outcome reward and ``gamma=1`` this is REINFORCE++-baseline as published (GRPO's centring,
    batch-level scaling). Samples alone in their group get 0 and stay out of the whitening
    statistics. Returns ``(advantages, G)``.
    """
    rewards, valid, maskf = _prepare("reinforce_pp_baseline", token_level_rewards, response_mask)
    group = _group_index("reinforce_pp_baseline", uids, rewards.shape[0], rewards.device)
    returns, g_c, _ = _return_to_go(rewards, valid, maskf, gamma)
    baseline, count = _group_mean(g_c[:, 0], group)
    keep = maskf * (count > 1).to(maskf.dtype)[:, None]  # lone samples: no baseline, no signal
    centred = (returns - baseline[:, None]) * keep
    return masked_whiten(centred, keep, eps=eps), returns


@register_advantage("gae")
@torch.no_grad()
def gae_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    eps: float = 1e-6,
    whiten: bool = True,
    **_: Any,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (PPO with a critic).

    Over the valid tokens ``k = 0..n-1`` of a row (observation tokens skipped, so the value of
    the last token of a turn bootstraps from the first token of the next turn):
    ``delta_k = r_k + gamma * V_{k+1} - V_k`` with ``V_n = 0`` (the end of the response is
    terminal, also when it was cut by the length budget: the truncated tail is not
    bootstrapped), ``A_k = delta_k + gamma * lam * A_{k+1}``. ``returns = A + V`` (the critic's
    target, never whitened). ``whiten=True`` (default, as in PPO implementations) whitens the
    advantages over the batch's valid tokens. Values at masked positions are ignored.
    """
    if values is None:
        raise ValueError("gae needs critic values: pass values=[B, R]")
    rewards, valid, maskf = _prepare("gae", token_level_rewards, response_mask, values)
    values = values.to(rewards.dtype)
    owner, width = _compact_index(valid)
    r_c = _scatter_steps(rewards, owner, width)
    dump = torch.where(valid, owner, torch.full_like(owner, width))
    v_c = torch.zeros(values.shape[0], width + 1, dtype=values.dtype, device=values.device)
    v_c = v_c.scatter_(1, dump, values)[:, :width]
    v_next = torch.cat([v_c[:, 1:], torch.zeros_like(v_c[:, :1])], dim=1)
    delta = r_c + gamma * v_next - v_c
    adv_c = torch.zeros_like(delta)
    running = torch.zeros_like(delta[:, 0])
    for k in range(width - 1, -1, -1):
        running = delta[:, k] + gamma * lam * running
        adv_c[:, k] = running
    adv = _gather_steps(adv_c, owner, maskf)
    returns = _gather_steps(adv_c + v_c, owner, maskf)
    if whiten:
        adv = masked_whiten(adv, maskf, eps=eps)
    return adv, returns


# --- per-turn estimator ----------------------------------------------------------------------
@register_advantage("grpo_turn")
@torch.no_grad()
def grpo_turn_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    uids: Uids | None = None,
    gamma: float = 1.0,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    unbiased_std: bool = True,
    **_: Any,
) -> tuple[Tensor, Tensor]:
    """Per-turn GRPO: tokens of turn t get the group-normalized return from turn t onwards.

    Turns are the maximal runs of valid tokens (a tool observation, masked 0, separates two
    turns); the rollout puts each turn's reward on the turn's last sampled token, so turn t's
    return is ``G_t = sum_{k >= t} gamma^(k - t) R_k`` over turns. Each sample counts once in
    its group's statistics, its turns sharing that weight: ``mean_g`` is the mean over samples
    of each sample's mean ``G_t``, the variance likewise, and ``A_t = (G_t - mean_g) / (std_g +
    eps)``. With only an outcome reward every ``G_t`` is the outcome and this is exactly
    `grpo`. Groups of one sample get 0.

    Why return-to-go: the rewards of turns before t are fixed when turn t is sampled, so
    dropping them from turn t's signal removes variance without adding bias; the group mean is
    a baseline shared by every turn (it includes the sample itself, like GRPO's).

    Bias when the policy controls episode length: the return *sums* per-turn rewards, so an
    episode with more turns accumulates more reward terms. If per-turn rewards are positive on
    average (e.g. a format bonus per turn), the estimator credits making extra turns and the
    policy learns to prolong episodes (redundant tool calls) instead of solving the task; with
    per-turn penalties it learns to stop early. Within an episode, early turns sum more terms
    than late ones, so with positive per-turn rewards late turns tend to fall below the group
    mean (a baseline shared by all turns stays unbiased, but fits late turns poorly). Keep
    per-turn rewards zero-mean or potential-based (``r_t = phi(s_{t+1}) - phi(s_t)``, which
    telescopes to a length-free total), bound the number of turns, or use ``gamma < 1``.
    """
    rewards, valid, maskf = _prepare("grpo_turn", token_level_rewards, response_mask)
    group = _group_index("grpo_turn", uids, rewards.shape[0], rewards.device)
    owner, turns, width = _turn_index(valid)
    g_c = _discounted(_scatter_steps(rewards, owner, width), gamma)
    adv_c = _group_normalize(
        g_c, turns, group, norm_by_std=norm_by_std, unbiased=unbiased_std, eps=eps
    )
    return _gather_steps(adv_c, owner, maskf), _gather_steps(g_c, owner, maskf)
