"""KL estimators and the in-reward KL penalty against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolrl.algo import apply_kl_in_reward, kl_penalty

T = torch.tensor
LP = T([-1.0, -2.0])
REF = T([-1.5, -1.0])  # log p - log ref = [0.5, -1.0]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("k1", [0.5, -1.0]),
        ("k2", [0.125, 0.5]),  # 0.5 * 0.25, 0.5 * 1
        ("abs", [0.5, 1.0]),
        # x = ref - lp = [-0.5, 1.0]; exp(x) - x - 1 = 0.6065307 - 0.5 = 0.1065307 and
        # 2.7182818 - 2 = 0.7182818
        ("k3", [0.1065307, 0.7182818]),
    ],
)
def test_kl_kinds_hand_values(kind, expected):
    torch.testing.assert_close(kl_penalty(LP, REF, kind), T(expected), atol=1e-6, rtol=0)


def test_k3_is_clamped_for_stability():
    lp = T([0.0, -50.0, -1e6])
    ref = T([-50.0, 0.0, 0.0])
    out = kl_penalty(lp, ref, "k3")
    # x = -50 -> clamped to -20: exp(-20) + 20 - 1 = 19.0 -> capped at 10;
    # x = 50 and 1e6 -> clamped to 20: exp(20) - 21 ~ 4.85e8 -> capped at 10. No inf/nan.
    torch.testing.assert_close(out, T([10.0, 10.0, 10.0]))


def test_unknown_kind_lists_the_valid_ones():
    with pytest.raises(ValueError, match="k1, k2, k3, abs"):
        kl_penalty(LP, REF, "forward")


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="same shape"):
        kl_penalty(LP, REF[:1], "k1")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-8, 0), st.floats(-8, 0)), min_size=1, max_size=20))
def test_k2_k3_abs_are_nonnegative_and_zero_at_equality(pairs):
    lp = T([p for p, _ in pairs])
    ref = T([r for _, r in pairs])
    for kind in ("k2", "k3", "abs"):
        assert (kl_penalty(lp, ref, kind) >= -1e-6).all()
        assert torch.count_nonzero(kl_penalty(lp, lp, kind)) == 0


def test_k1_and_k3_are_unbiased_for_the_true_kl():
    # p = softmax([0, 1, 2]), ref = uniform over 3. Sampling a from p, E[k1] = E[k3] = KL(p||ref).
    logits = T([0.0, 1.0, 2.0])
    log_p = logits.log_softmax(-1)
    log_ref = torch.full((3,), -math.log(3.0))
    true_kl = float((log_p.exp() * (log_p - log_ref)).sum())
    probs = log_p.exp()
    for kind in ("k1", "k3"):
        expected = float((probs * kl_penalty(log_p, log_ref, kind)).sum())
        assert expected == pytest.approx(true_kl, rel=1e-5), kind


def test_apply_kl_in_reward_hand_values():
    scores = T([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    mask = T([[1, 1, 1, 0], [1, 1, 0, 0]])
    lp = T([[-1.0, -1.0, -1.0, -5.0], [-2.0, -1.0, -9.0, -9.0]])
    ref = T([[-1.5, -0.5, -1.0, 0.0], [-1.0, -1.0, 0.0, 0.0]])
    rewards, metrics = apply_kl_in_reward(scores, lp, ref, mask, coef=0.1, kind="k1")
    # k1 on valid tokens: row 0 [0.5, -0.5, 0], row 1 [-1, 0]; rewards = scores - 0.1 * k1
    torch.testing.assert_close(rewards, T([[-0.05, 0.05, 1.0, 0.0], [0.1, 2.0, 0.0, 0.0]]))
    # token mean (0.5 - 0.5 + 0 - 1 + 0) / 5 = -0.2; per-sequence sums 0 and -1 -> mean -0.5
    assert metrics == pytest.approx({"kl": -0.2, "kl_seq": -0.5, "kl_coef": 0.1})


def test_apply_kl_in_reward_rejects_negative_coef():
    with pytest.raises(ValueError, match=">= 0"):
        apply_kl_in_reward(LP[None], LP[None], REF[None], torch.ones(1, 2), coef=-1.0)

