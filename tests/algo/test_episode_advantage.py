"""Advantages of agent episodes that split into several samples (hand-computed values)."""

from __future__ import annotations

import pytest
import torch

from toolrl.algo import compute_advantage, episode_advantage, share_advantages


def test_split_samples_share_their_lead_and_count_once_in_the_group():
    # rows 0,1: one episode (lead 1, reward 1); row 2: one episode (reward 0); one group
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    rewards = torch.zeros(3, 3)
    rewards[1, 0] = 1.0
    adv, ret = episode_advantage("grpo", rewards, mask, [1, 1, 2], ["g", "g", "g"])
    # grpo over the two episodes (1, 0): mean 0.5, unbiased std 0.7071 -> +-0.7071
    a = 0.5 / (2 ** 0.5 / 2 + 1e-6)
    assert torch.allclose(adv, torch.tensor([[a, a, 0], [a, 0, 0], [-a, -a, -a]]), atol=1e-5)
    assert torch.equal(ret, torch.tensor([[1.0, 1, 0], [1, 0, 0], [0, 0, 0]]))
    # without the split the duplicate would have counted twice: a different advantage
    plain, _ = compute_advantage("grpo", rewards + torch.tensor([[0, 1.0, 0], [0, 0, 0],
                                                                  [0, 0, 0]]), mask,
                                 uids=["g", "g", "g"])
    assert plain[2, 0] != pytest.approx(-a)


def test_share_refuses_token_level_advantages():
    adv = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="varies over its tokens"):
        share_advantages(adv, torch.ones(2, 2), [0, 0])
    with pytest.raises(ValueError, match="leads"):
        share_advantages(adv, torch.ones(2, 2), [0])
