"""Advantage estimators against hand-computed values, plus properties that must always hold."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolrl.algo import compute_advantage
from toolrl.algo.advantage import (
    dr_grpo_advantage,
    gae_advantage,
    grpo_advantage,
    grpo_turn_advantage,
    reinforce_pp_advantage,
    reinforce_pp_baseline_advantage,
    rloo_advantage,
)

T = torch.tensor


def close(actual: torch.Tensor, expected, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, T(expected, dtype=actual.dtype), atol=atol, rtol=0)


# Six rows, R = 4, three groups. Scores (sum of a row's rewards): a = [1, 2, 6], b = [5, 5],
# c = [7]. Row 2's score is split over two tokens (0.5 + 1.5) to show the outcome is a sum.
MASK = T([
    [1, 1, 1, 0],  # a, score 1
    [1, 1, 0, 0],  # b, score 5
    [1, 1, 1, 1],  # a, score 2
    [1, 0, 0, 0],  # c, score 7
    [1, 1, 0, 0],  # a, score 6
    [1, 1, 1, 0],  # b, score 5
])
REWARDS = T([
    [0, 0, 1, 0],
    [0, 5, 0, 0],
    [0.5, 0, 0, 1.5],
    [7, 0, 0, 0],
    [0, 6, 0, 0],
    [0, 0, 5, 0],
])
UIDS = ["a", "b", "a", "c", "a", "b"]


def spread(per_row: list[float]) -> list[list[float]]:
    """A per-sample value on every valid token of MASK, 0 elsewhere."""
    return [[v * float(m) for m in row] for v, row in zip(per_row, MASK.tolist(), strict=True)]


def test_grpo_hand_values():
    adv, ret = grpo_advantage(REWARDS, MASK, uids=UIDS)
    # group a: mean 3, deviations -2, -1, 3; unbiased var (4 + 1 + 9) / 2 = 7, std sqrt(7)
    # = 2.6457513 -> -0.7559289, -0.3779645, 1.1338934. b: equal rewards -> 0. c: alone -> 0.
    close(adv, spread([-0.7559289, 0.0, -0.3779645, 0.0, 1.1338934, 0.0]))
    close(ret, spread([1, 5, 2, 7, 6, 5]))


def test_grpo_population_std_option():
    adv, _ = grpo_advantage(REWARDS, MASK, uids=UIDS, unbiased_std=False)
    # population var 14 / 3, std 2.1602469 -> -0.9258201, -0.4629100, 1.3887301
    close(adv, spread([-0.9258201, 0.0, -0.4629100, 0.0, 1.3887301, 0.0]))


def test_dr_grpo_and_rloo_hand_values():
    adv, _ = dr_grpo_advantage(REWARDS, MASK, uids=UIDS)
    close(adv, spread([-2.0, 0.0, -1.0, 0.0, 3.0, 0.0]))  # R - mean, no std
    adv, _ = rloo_advantage(REWARDS, MASK, uids=UIDS)
    # a: baselines (2+6)/2 = 4, (1+6)/2 = 3.5, (1+2)/2 = 1.5 -> 1-4, 2-3.5, 6-1.5
    close(adv, spread([-3.0, 0.0, -1.5, 0.0, 4.5, 0.0]))


# One multi-turn row: turn 1 = positions 0-1, tool observation at 2-3 (mask 0), turn 2 = 4-5,
# padding at 6. Rewards 0.5 at the end of turn 1 and 1.0 at the end of turn 2.
HOLE_MASK = T([[1, 1, 0, 0, 1, 1, 0]])
HOLE_REWARDS = T([[0, 0.5, 0, 0, 0, 1.0, 0]])


def test_reinforce_pp_return_to_go_skips_holes():
    adv, ret = reinforce_pp_advantage(HOLE_REWARDS, HOLE_MASK, gamma=0.5)
    # valid steps 0,1,4,5 carry rewards [0, 0.5, 0, 1]; G_3 = 1, G_2 = 0.5 * 1 = 0.5,
    # G_1 = 0.5 + 0.5 * 0.5 = 0.75, G_0 = 0.5 * 0.75 = 0.375. (Resetting the return at the
    # observation, as a padding-style mask would, gives 0.5 / 0.25 on turn 1 instead.)
    close(ret, [[0.375, 0.75, 0, 0, 0.5, 1.0, 0]])
    # whitening over the 4 valid tokens: mean 2.625 / 4 = 0.65625; squared deviations sum to
    # 0.0791016 + 0.0087891 + 0.0244141 + 0.1181641 = 0.2304688, unbiased var 0.0768229,
    # std 0.2771695; (G - mean) / std:
    close(adv, [[-1.0147221, 0.3382407, 0, 0, -0.5637345, 1.2402159, 0]])


def test_reward_on_an_observation_token_is_credited_to_the_previous_action():
    moved = T([[0, 0, 0, 0.5, 0, 1.0, 0]])  # turn-1 reward on an observation token
    _, ret = reinforce_pp_advantage(moved, HOLE_MASK, gamma=0.5)
    close(ret, [[0.375, 0.75, 0, 0, 0.5, 1.0, 0]])
    # before any valid token: credited to the first one
    _, ret = reinforce_pp_advantage(T([[2.0, 0, 0]]), T([[0, 1, 1]]), gamma=0.5)
    close(ret, [[0, 2.0, 0]])


def test_reinforce_pp_baseline_hand_values():
    rewards = T([[0, 1.0, 0], [0, 0, 3.0]])
    mask = T([[1, 1, 0], [1, 1, 1]])
    adv, ret = reinforce_pp_baseline_advantage(rewards, mask, uids=["g", "g"])
    # baseline = group mean of returns (1 + 3) / 2 = 2 -> tokens [-1, -1 | 1, 1, 1];
    # batch whitening over 5 tokens: mean 0.2, squared deviations 2 * 1.44 + 3 * 0.64 = 4.8,
    # unbiased var 1.2, std 1.0954451 -> -1.2 / std = -1.0954451, 0.8 / std = 0.7302967
    close(adv, [[-1.0954451, -1.0954451, 0], [0.7302967, 0.7302967, 0.7302967]])
    close(ret, [[1, 1, 0], [3, 3, 3]])


def test_gae_hand_values_with_a_hole():
    mask = T([[1, 0, 1, 1, 0]])
    rewards = T([[0, 0, 0, 1.0, 0]])
    # 9.0 and 7.0 sit on masked positions and must be ignored
    values = T([[0.5, 9.0, 0.25, 1.0, 7.0]])
    adv, ret = gae_advantage(rewards, mask, values=values, gamma=0.9, lam=0.8, whiten=False)
    # compact steps: r = [0, 0, 1], V = [0.5, 0.25, 1.0], V_next = [0.25, 1.0, 0 (terminal)]
    # delta = [0 + 0.225 - 0.5, 0 + 0.9 - 0.25, 1 + 0 - 1] = [-0.275, 0.65, 0]
    # A_2 = 0, A_1 = 0.65, A_0 = -0.275 + 0.9 * 0.8 * 0.65 = 0.193; returns = A + V
    close(adv, [[0.193, 0, 0.65, 0, 0]])
    close(ret, [[0.693, 0, 0.9, 1.0, 0]])
    whitened, _ = gae_advantage(rewards, mask, values=values, gamma=0.9, lam=0.8)
    # valid advantages [0.193, 0.65, 0]: mean 0.281, deviations -0.088, 0.369, -0.281,
    # unbiased var (0.007744 + 0.136161 + 0.078961) / 2 = 0.111433, std 0.3338158
    close(whitened, [[-0.2636184, 0, 1.1054000, -0.8417816, 0]])


def test_grpo_turn_hand_values():
    # sample 0: two turns (tokens 0-1, then 3-4), turn rewards 0.2 and 1.0 -> returns 1.2, 1.0
    # sample 1: one turn (tokens 0-2), reward 0 -> return 0
    rewards = T([[0, 0.2, 0, 0, 1.0], [0, 0, 0, 0, 0]])
    mask = T([[1, 1, 0, 1, 1], [1, 1, 1, 0, 0]])
    adv, ret = grpo_turn_advantage(rewards, mask, uids=["g", "g"])
    # sample means 1.1 and 0 -> group mean 0.55. variance: sample 0 averages its turns'
    # squared deviations ((0.65^2 + 0.45^2) / 2 = 0.3125), sample 1 gives 0.55^2 = 0.3025;
    # unbiased: (0.3125 + 0.3025) / 1 = 0.615, std 0.7842194.
    # A = 0.65 / std = 0.8288497, 0.45 / std = 0.5738190, -0.55 / std = -0.7013344
    close(adv, [[0.8288497, 0.8288497, 0, 0.5738190, 0.5738190], [-0.7013344] * 3 + [0, 0]])
    close(ret, [[1.2, 1.2, 0, 1.0, 1.0], [0, 0, 0, 0, 0]])


def test_lone_samples_get_zero_advantage():
    rewards = T([[0, 0.2, 0, 1.0]])
    mask = T([[1, 1, 0, 1]])
    for name in ("grpo", "dr_grpo", "rloo", "grpo_turn", "reinforce_pp_baseline"):
        adv, _ = compute_advantage(name, rewards, mask, uids=["only"])
        assert torch.count_nonzero(adv) == 0, name


def test_integer_rewards_become_float():
    adv, ret = grpo_advantage(T([[1, 0], [0, 0]]), T([[1, 0], [1, 1]]), uids=[0, 0])
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    # scores 1, 0: +-0.5 / (unbiased std 0.7071068 + 1e-6) = 0.7071058
    close(adv, [[0.7071058, 0], [-0.7071058, -0.7071058]])


def test_uids_may_be_a_tensor():
    a, _ = grpo_advantage(REWARDS, MASK, uids=torch.tensor([0, 1, 0, 2, 0, 1]))
    b, _ = grpo_advantage(REWARDS, MASK, uids=UIDS)
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: grpo_advantage(REWARDS, MASK), "pass uids"),
        (lambda: grpo_advantage(REWARDS, MASK, uids=["a"]), "1 uids for 6 rows"),
        (lambda: grpo_advantage(REWARDS, MASK[:, :2], uids=UIDS), "must match"),
        (lambda: grpo_advantage(REWARDS[0], MASK[0], uids=UIDS), r"must be \[B, R\]"),
        (lambda: gae_advantage(REWARDS, MASK), "needs critic values"),
        (lambda: gae_advantage(REWARDS, MASK, values=MASK[:, :3].float()), "values"),
    ],
)
def test_bad_input_is_a_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- properties ------------------------------------------------------------------------------
@st.composite
def batches(draw, min_rows: int = 1):
    """Random rewards, masks with holes (every row has a valid token) and group ids."""
    b = draw(st.integers(min_rows, 7))
    r = draw(st.integers(1, 7))
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=r, max_size=r),
                                      min_size=b, max_size=b)))
    for i in range(b):
        mask[i, draw(st.integers(0, r - 1))] = True
    floats = st.floats(-5, 5, allow_nan=False, width=32)
    rewards = torch.tensor(draw(st.lists(st.lists(floats, min_size=r, max_size=r),
                                         min_size=b, max_size=b)))
    values = torch.tensor(draw(st.lists(st.lists(floats, min_size=r, max_size=r),
                                        min_size=b, max_size=b)))
    uids = draw(st.lists(st.sampled_from("xyz"), min_size=b, max_size=b))
    return rewards, mask, values, uids


def _reference_return_to_go(rewards, mask, gamma):
    """Straightforward loop: valid tokens are consecutive steps, rewards lie on valid tokens."""
    out = torch.zeros_like(rewards, dtype=torch.float64)
    for b in range(rewards.shape[0]):
        steps = [t for t in range(rewards.shape[1]) if mask[b, t]]
        running = 0.0
        for t in reversed(steps):
            running = float(rewards[b, t]) + gamma * running
            out[b, t] = running
    return out


ALL = ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae", "grpo_turn"]


@settings(max_examples=60, deadline=None)
@given(batch=batches(), gamma=st.sampled_from([1.0, 0.9, 0.5]), lam=st.sampled_from([1.0, 0.7]))
def test_every_estimator_is_zero_outside_the_mask_and_finite(batch, gamma, lam):
    rewards, mask, values, uids = batch
    for name in ALL:
        adv, ret = compute_advantage(name, rewards, mask, uids=uids, values=values, gamma=gamma,
                                     lam=lam)
        assert adv.shape == rewards.shape and ret.shape == rewards.shape
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), name
        assert torch.count_nonzero(adv[~mask]) == 0, name
        assert torch.count_nonzero(ret[~mask]) == 0, name


@settings(max_examples=60, deadline=None)
@given(batch=batches())
def test_grpo_group_means_are_zero_and_tokens_of_a_sample_share_one_value(batch):
    rewards, mask, _, uids = batch
    adv, _ = grpo_advantage(rewards, mask, uids=uids)
    per_sample = [float(adv[i][mask[i]][0]) for i in range(len(uids))]
    for i in range(len(uids)):
        assert torch.allclose(adv[i][mask[i]], torch.tensor(per_sample[i]))
    for g in set(uids):
        members = [per_sample[i] for i, u in enumerate(uids) if u == g]
        assert abs(sum(members)) < 1e-4 * max(1, len(members))


@settings(max_examples=60, deadline=None)
@given(batch=batches())
def test_rloo_is_a_rescaled_dr_grpo(batch):
    rewards, mask, _, uids = batch
    rloo, _ = rloo_advantage(rewards, mask, uids=uids)
    dr, _ = dr_grpo_advantage(rewards, mask, uids=uids)
    n = torch.tensor([uids.count(u) for u in uids], dtype=torch.float32)[:, None]
    scale = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    torch.testing.assert_close(rloo, dr * scale, atol=1e-4, rtol=1e-5)


@settings(max_examples=60, deadline=None)
@given(batch=batches(), gamma=st.sampled_from([1.0, 0.9, 0.5]))
def test_return_to_go_matches_a_reference_loop_and_gae_with_lambda_one(batch, gamma):
    rewards, mask, values, _ = batch
    rewards = rewards * mask  # the reference assumes rewards only on valid tokens
    _, ret = reinforce_pp_advantage(rewards, mask, gamma=gamma)
    expected = _reference_return_to_go(rewards, mask, gamma).float()
    torch.testing.assert_close(ret, expected, atol=1e-4, rtol=1e-5)
    # GAE with lam = 1: A + V telescopes to the discounted return, whatever the values are
    _, gae_ret = gae_advantage(rewards, mask, values=values, gamma=gamma, lam=1.0)
    torch.testing.assert_close(gae_ret, expected, atol=1e-4, rtol=1e-5)


@settings(max_examples=60, deadline=None)
@given(batch=batches())
def test_grpo_turn_equals_grpo_for_outcome_rewards(batch):
    rewards, mask, _, uids = batch
    outcome = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        last = int(torch.nonzero(mask[i])[-1])
        outcome[i, last] = rewards[i, 0]
    turn, _ = grpo_turn_advantage(outcome, mask, uids=uids)
    plain, _ = grpo_advantage(outcome, mask, uids=uids)
    torch.testing.assert_close(turn, plain, atol=1e-5, rtol=1e-5)


def test_gae_ignores_values_on_masked_positions():
    rewards = T([[0, 0, 0, 1.0, 0]])
    mask = T([[1, 0, 1, 1, 0]])
    a, ra = gae_advantage(rewards, mask, values=T([[0.5, 0.0, 0.25, 1.0, 0.0]]), gamma=0.9,
                          lam=0.8, whiten=False)
    b, rb = gae_advantage(rewards, mask, values=T([[0.5, -3.0, 0.25, 1.0, math.pi]]),
                          gamma=0.9, lam=0.8, whiten=False)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ra, rb)
