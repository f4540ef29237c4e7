"""Credit assignment (`toolrl.algo.credit.place_rewards`) against hand-computed placements."""

from __future__ import annotations

import math

import pytest
import torch

from toolrl.algo import compute_advantage, place_rewards


def mask(*rows: str) -> torch.Tensor:
    """``"sso.."``: s = sampled (1), o = observation (0), . = padding (0)."""
    return torch.tensor([[1 if c == "s" else 0 for c in r] for r in rows])


def test_single_turn_outcome_on_the_last_sampled_token():
    m = mask("ssss..", "ss....")
    out = place_rewards(m, [1.0, -0.5])
    assert out.dtype == torch.float32
    assert out.tolist() == [[0, 0, 0, 1.0, 0, 0], [0, -0.5, 0, 0, 0, 0]]


def test_multi_turn_per_turn_rewards_skip_masked_observations():
    # turns at [0, 3), [5, 7), [9, 11); observations between them are masked out
    m = mask("sssoossooss.")
    out = place_rewards(m, [2.0], per_turn=[[0.1, -0.2, 0.5]], turn_ends=[[3, 7, 11]])
    expected = [0.0] * 12
    expected[2] = 0.1  # end of turn 0
    expected[6] = -0.2  # end of turn 1
    expected[10] = 0.5 + (2.0 - (0.1 - 0.2 + 0.5))  # turn 2's reward and the outcome 1.6
    assert out[0].tolist() == pytest.approx(expected)
    assert out[0][m[0] == 0].abs().sum() == 0  # nothing on an observation or padding
    assert float(out.sum()) == pytest.approx(2.0)  # the total is conserved


def test_per_turn_rewards_that_do_not_match_the_turns_fall_back_to_the_outcome():
    m = mask("ssooss")
    out = place_rewards(m, [1.0], per_turn=[[0.3]], turn_ends=[[2, 6]])
    assert out.tolist() == [[0, 0, 0, 0, 0, 1.0]]
    none = place_rewards(m, [1.0], per_turn=[None], turn_ends=[[2, 6]])
    assert none.tolist() == out.tolist()


def test_truncated_episodes():
    # cut by the budget mid-turn: the last turn runs to the end of the response row
    cut = place_rewards(mask("ssoosss"), [1.0], per_turn=[[0.25, 0.5]], turn_ends=[[2, 7]])
    assert cut.tolist() == [[0, 0.25, 0, 0, 0, 0, 1.0 - 0.25]]
    # an observation that did not fit (finish reason "context"): the outcome stays on the last
    # sampled token, not on the cut observation after it
    ctx = place_rewards(mask("sssoo"), [1.0])
    assert ctx.tolist() == [[0, 0, 1.0, 0, 0]]
    # a span that ends past the row (a wider episode than the batch) is clamped to the row
    wide = place_rewards(mask("ssss"), [2.0], per_turn=[[1.0]], turn_ends=[[9]])
    assert wide.tolist() == [[0, 0, 0, 1.0 + (2.0 - 1.0)]]
    # an episode that failed before its first turn gets nothing
    empty = place_rewards(mask("...."), [5.0], per_turn=[[1.0]], turn_ends=[[0]])
    assert empty.tolist() == [[0, 0, 0, 0]]


def test_per_turn_rewards_with_grpo_turn():
    """Two samples of one task, two turns each; A earns 0.5 on turn 0 and the outcome 1.0,
    B nothing. Return-to-go per turn: A [1.5, 1.0], B [0, 0]; sample means 1.25 and 0; the
    group mean 0.625; step-averaged squared deviations A ((0.875^2 + 0.375^2) / 2 = 0.453125)
    and B (0.625^2 = 0.390625), unbiased variance 0.84375."""
    m = mask("ssooss.", "ssooss.")
    scores = place_rewards(m, [1.5, 0.0], per_turn=[[0.5, 0.0], [0.0, 0.0]],
                           turn_ends=[[2, 6], [2, 6]])
    assert scores.tolist() == [[0, 0.5, 0, 0, 0, 1.0, 0], [0] * 7]
    adv, ret = compute_advantage("grpo_turn", scores, m, uids=["t", "t"], eps=0.0)
    std = math.sqrt(0.84375)
    a0, a1, b = 0.875 / std, 0.375 / std, -0.625 / std
    assert adv[0].tolist() == pytest.approx([a0, a0, 0, 0, a1, a1, 0], abs=1e-6)
    assert adv[1].tolist() == pytest.approx([b, b, 0, 0, b, b, 0], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([1.5, 1.5, 0, 0, 1.0, 1.0, 0])


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="2 totals for a batch of 1"):
        place_rewards(mask("ss"), [1.0, 2.0])
    with pytest.raises(ValueError, match="per_turn needs turn_ends"):
        place_rewards(mask("ss"), [1.0], per_turn=[[1.0]])
