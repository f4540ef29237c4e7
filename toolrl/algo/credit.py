"""Credit assignment: where a trajectory's rewards land on its response tokens.

`place_rewards` turns per-episode reward totals (and optional per-turn rewards) into the
``[B, R]`` ``token_level_scores`` the advantage estimators read (`toolrl.algo.advantage`):

- the outcome (the total minus the per-turn parts) goes on the last sampled token of the row;
- a per-turn reward goes on the last token of its turn (the token before the turn's end);
  per-turn rewards are used only when there is one per turn of the episode, else the whole
  total is the outcome;
- a row without any sampled token (an episode that failed before its first turn) gets 0.

Observation tokens (mask 0) never receive a reward here; the estimators credit a reward on a
masked position to the nearest valid token before it. Pure tensor math, no trajectories: the
caller passes each row's turn ends (`toolrl.core.trajectory.Trajectory.turn_ends`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from toolrl.algo.advantage import compute_advantage

__all__ = ["place_rewards"]


def place_rewards(response_mask: Tensor, totals: Sequence[float],
                  per_turn: Sequence[Sequence[float] | None] | None = None,
                  turn_ends: Sequence[Sequence[int]] | None = None) -> Tensor:
    """``[B, R]`` float32 scores: each row's reward placed on its response tokens.

    Args:
        response_mask: ``[B, R]``, 1 on sampled tokens.
        totals: each row's total reward.
        per_turn: each row's per-turn rewards (None: outcome only); they are part of the total.
        turn_ends: each row's turn ends (exclusive positions in the response), one per turn.
    """
    batch, width = response_mask.shape
    if len(totals) != batch:
        raise ValueError(f"{len(totals)} totals for a batch of {batch}")
    if per_turn is not None and (turn_ends is None or len(per_turn) != batch
                                 or len(turn_ends) != batch):
        raise ValueError("per_turn needs turn_ends, both with one entry per row")
    scores = torch.zeros((batch, width), dtype=torch.float32)
    for i in range(batch):
        positions = response_mask[i].nonzero().flatten()
        if len(positions) == 0:
            continue
        outcome = totals[i]
        turns = per_turn[i] if per_turn is not None else None
        if turns and len(turns) == len(turn_ends[i]):
            for end, value in zip(turn_ends[i], turns, strict=True):
                last = min(int(end), width) - 1
                if last >= 0:
                    scores[i, last] += float(value)
            outcome = totals[i] - sum(turns)
        scores[i, positions[-1]] += float(outcome)
    return scores


def share_advantages(advantages: Tensor, response_mask: Tensor, leads: Sequence[int]) -> Tensor:
    """``[B, R]`` advantages where row ``i`` takes row ``leads[i]``'s: the samples of one
    episode (an agent whose rewritten history split it) share their lead sample's advantage.

    The lead's advantage must be one value over its sampled tokens (outcome estimators:
    grpo, dr_grpo, rloo, ...); row ``i`` gets that value on its own sampled tokens.
    """
    batch = advantages.shape[0]
    if len(leads) != batch or response_mask.shape != advantages.shape:
        raise ValueError(f"{len(leads)} leads for {batch} rows, mask {tuple(response_mask.shape)}"
                         f" for advantages {tuple(advantages.shape)}")
    mask = response_mask.bool()
    value = torch.zeros(batch, dtype=advantages.dtype)
    for i in set(leads):
        row = advantages[i][mask[i]]
        if len(row) and not torch.allclose(row, row[0].expand_as(row)):
            raise ValueError(f"row {i}'s advantage varies over its tokens: samples can share "
                             f"only one value per episode (an outcome estimator)")
        value[i] = row[0] if len(row) else 0.0
    index = torch.as_tensor(list(leads), dtype=torch.long)
    return value[index][:, None] * mask.to(advantages.dtype)


def episode_advantage(name: str, rewards: Tensor, response_mask: Tensor, leads: Sequence[int],
                      uids: Sequence[Any], **kwargs: Any) -> tuple[Tensor, Tensor]:
    """`compute_advantage` where several rows may be one episode: the estimator sees each
    episode once (its lead row, ``leads[i]`` for row ``i``), and every row of the episode
    shares the lead's advantage and return (`share_advantages`)."""
    rows = sorted(set(leads))
    sub = torch.as_tensor(rows, dtype=torch.long)
    kwargs = {k: (v[sub] if isinstance(v, Tensor) else v) for k, v in kwargs.items()}
    adv_l, ret_l = compute_advantage(name, rewards[sub], response_mask[sub],
                                     uids=[uids[i] for i in rows], **kwargs)
    adv, ret = torch.zeros_like(rewards, dtype=adv_l.dtype), torch.zeros_like(
        rewards, dtype=ret_l.dtype)
    adv[sub], ret[sub] = adv_l, ret_l
    return share_advantages(adv, response_mask, leads), share_advantages(ret, response_mask,
                                                                         leads)
