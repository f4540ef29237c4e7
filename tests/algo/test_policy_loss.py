"""Policy losses (PPO clip / dual-clip / clip-higher / corrections, GSPO, CISPO), the full actor
objective and the critic's value loss, against hand-computed values and gradients."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolrl.algo import LossAggregator, PolicyLossConfig, actor_loss, value_loss
from toolrl.algo.loss import cispo_loss, gspo_loss, ppo_clip_loss

T = torch.tensor
TOKEN_MEAN = LossAggregator("token-mean")

# Five valid tokens and one masked one (A = 5, ratio 10: must not count).
#   token  A   ratio   with low 0.2 / high 0.28 / c 3
#   0     +1   1.1     inside the range           -> -A * r        = -1.1
#   1     +1   1.5     above 1.28: clipped         -> -1 * 1.28     = -1.28
#   2     -1   0.5     below 0.8: clipped          -> max(0.5, 0.8) = 0.8
#   3     -1   4.0     above c = 3: dual-clipped   -> min(4, 3)     = 3
#   4     -2   1.0     inside                      -> 2
RATIO = T([[1.1, 1.5, 0.5, 4.0, 1.0, 10.0]])
ADV = T([[1.0, 1.0, -1.0, -1.0, -2.0, 5.0]])
MASK = T([[1, 1, 1, 1, 1, 0]])
OLD = torch.zeros(1, 6)
CONFIG = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)


def _log_probs() -> torch.Tensor:
    return RATIO.log().requires_grad_(True)


def test_ppo_clip_hand_values_and_metrics():
    lp = _log_probs()
    loss, m = ppo_clip_loss(lp, OLD, ADV, MASK, config=CONFIG, agg=TOKEN_MEAN)
    # (-1.1 - 1.28 + 0.8 + 3 + 2) / 5 = 3.42 / 5
    assert loss.item() == pytest.approx(0.684)
    assert m["pg_loss"] == pytest.approx(0.684)
    assert m["pg_clipfrac_upper"] == pytest.approx(0.2)  # token 1
    assert m["pg_clipfrac_lower"] == pytest.approx(0.2)  # token 2
    assert m["pg_clipfrac"] == pytest.approx(0.4)
    assert m["pg_dualclip_frac"] == pytest.approx(0.2)  # token 3
    assert m["ratio_mean"] == pytest.approx(8.1 / 5)  # 1.1 + 1.5 + 0.5 + 4 + 1
    assert m["ratio_max"] == pytest.approx(4.0)  # the masked 10 is ignored
    # k1 = mean(-log r) = -(0.0953102 + 0.4054651 - 0.6931472 + 1.3862944 + 0) / 5
    assert m["ppo_kl_k1"] == pytest.approx(-0.2387845, abs=1e-6)
    # k3 = mean(r - 1 - log r) = (0.0046898 + 0.0945349 + 0.1931472 + 1.6137056 + 0) / 5
    assert m["ppo_kl_k3"] == pytest.approx(0.3812155, abs=1e-6)
    assert m["tokens"] == 5
    (grad,) = torch.autograd.grad(loss, lp)
    # d(-A r)/d log p = -A r on unclipped tokens (0: -1.1, 4: 2.0), / 5 tokens; clipped,
    # dual-clipped and masked tokens get exactly 0.
    torch.testing.assert_close(grad, T([[-0.22, 0.0, 0.0, 0.0, 0.4, 0.0]]))


def test_without_dual_clip_the_negative_advantage_token_is_unbounded():
    lp = _log_probs()
    config = dataclasses.replace(CONFIG, clip_ratio_c=None)
    loss, m = ppo_clip_loss(lp, OLD, ADV, MASK, config=config, agg=TOKEN_MEAN)
    assert loss.item() == pytest.approx((-1.1 - 1.28 + 0.8 + 4.0 + 2.0) / 5)
    assert "pg_dualclip_frac" not in m
    (grad,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(grad, T([[-0.22, 0.0, 0.0, 0.8, 0.4, 0.0]]))  # token 3: 4 / 5


def test_symmetric_clip_clips_token_zero_too():
    config = dataclasses.replace(CONFIG, clip_ratio_high=0.05)
    loss, m = ppo_clip_loss(_log_probs(), OLD, ADV, MASK, config=config, agg=TOKEN_MEAN)
    assert loss.item() == pytest.approx((-1.05 - 1.05 + 0.8 + 3.0 + 2.0) / 5)
    assert m["pg_clipfrac_upper"] == pytest.approx(0.4)


def test_truncated_importance_sampling_hand_values():
    # raw weights pi_old / pi_rollout = [1, 1.5, 0.5, 3, 1, 7]; cap 2 -> [1, 1.5, 0.5, 2, 1]
    rollout = OLD - T([[1.0, 1.5, 0.5, 3.0, 1.0, 7.0]]).log()
    config = dataclasses.replace(CONFIG, corrections=[{"name": "tis", "cap": 2.0}])
    lp = _log_probs()
    loss, m = ppo_clip_loss(lp, OLD, ADV, MASK, config=config, agg=TOKEN_MEAN,
                            rollout_log_probs=rollout)
    # (-1.1 * 1 - 1.28 * 1.5 + 0.8 * 0.5 + 3 * 2 + 2 * 1) / 5 = 5.38 / 5
    assert loss.item() == pytest.approx(1.076)
    assert m["is_weight_mean"] == pytest.approx(6.0 / 5)
    assert m["tis_capped"] == pytest.approx(0.2)
    (grad,) = torch.autograd.grad(loss, lp)  # the weights are constants: -A r w / 5
    torch.testing.assert_close(grad, T([[-0.22, 0.0, 0.0, 0.0, 0.4, 0.0]]))


def test_corrections_without_rollout_log_probs_are_an_error():
    config = dataclasses.replace(CONFIG, corrections=["tis"])
    with pytest.raises(ValueError, match="rollout_log_probs"):
        ppo_clip_loss(_log_probs(), OLD, ADV, MASK, config=config, agg=TOKEN_MEAN)


def test_mismatched_shapes_are_an_error():
    with pytest.raises(ValueError, match="shape of log_probs"):
        ppo_clip_loss(_log_probs(), OLD[:, :3], ADV, MASK, config=CONFIG, agg=TOKEN_MEAN)


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.tuples(st.floats(-3, 3), st.floats(0.81, 1.27), st.booleans()),
                  min_size=1, max_size=12),
)
def test_ppo_clip_is_the_plain_surrogate_inside_the_clip_range(data):
    adv = T([[a for a, _, _ in data]])
    ratio = T([[r for _, r, _ in data]])
    mask = T([[m for _, _, m in data]])
    loss, _ = ppo_clip_loss(ratio.log(), torch.zeros_like(ratio), adv, mask, config=CONFIG,
                            agg=TOKEN_MEAN)
    expected = (-adv * ratio * mask).sum() / mask.sum().clamp(min=1)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(
        st.one_of(
            st.tuples(st.floats(0.01, 3), st.floats(1.3, 2.9)),  # A > 0, r > 1 + high
            st.tuples(st.floats(-3, -0.01), st.floats(0.05, 0.79)),  # A < 0, r < 1 - low
            st.tuples(st.floats(-3, -0.01), st.floats(3.1, 20)),  # A < 0, r > c (dual-clip)
            st.tuples(st.floats(-3, 3), st.floats(0.81, 1.27)),  # inside: gradient -A r / N
        ),
        min_size=1,
        max_size=12,
    )
)
def test_ppo_clip_gradient_is_zero_exactly_on_clipped_tokens(data):
    adv = T([[a for a, _ in data]])
    ratio = T([[r for _, r in data]])
    lp = ratio.log().requires_grad_(True)
    loss, _ = ppo_clip_loss(lp, torch.zeros_like(ratio), adv, torch.ones_like(adv),
                            config=CONFIG, agg=TOKEN_MEAN)
    (grad,) = torch.autograd.grad(loss, lp)
    inside = (ratio > 0.8) & (ratio < 1.28)
    expected = torch.where(inside, -adv * ratio / len(data), torch.zeros_like(adv))
    torch.testing.assert_close(grad, expected, atol=1e-6, rtol=1e-5)


def test_gspo_uses_the_sequence_level_ratio():
    # row 0: log-ratios [0.2, 0.0] -> s = exp(0.1) = 1.1051709; row 1: [0.4, -0.4] -> s = 1
    lp = T([[0.2, 0.0, 5.0], [0.4, -0.4, 0.0]]).requires_grad_(True)
    old = torch.zeros(2, 3)
    adv = T([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = T([[1, 1, 0], [1, 1, 0]])
    loss, _ = gspo_loss(lp, old, adv, mask, config=CONFIG, agg=TOKEN_MEAN)
    # per token -A * s: row 0 -1.1051709 twice, row 1 +1 twice -> mean over 4 tokens
    assert loss.item() == pytest.approx((-2 * 1.1051709 + 2.0) / 4, abs=1e-6)
    (grad,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(
        grad, T([[-1.1051709 / 4, -1.1051709 / 4, 0.0], [0.25, 0.25, 0.0]]), atol=1e-6, rtol=0
    )
    # a tight upper clip (1.05 < 1.105) clips the whole of row 0: constant, no gradient
    tight = dataclasses.replace(CONFIG, clip_ratio_high=0.05)
    loss, m = gspo_loss(lp, old, adv, mask, config=tight, agg=TOKEN_MEAN)
    assert loss.item() == pytest.approx((-2 * 1.05 + 2.0) / 4)
    assert m["pg_clipfrac_upper"] == pytest.approx(0.5)
    (grad,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(grad, T([[0.0, 0.0, 0.0], [0.25, 0.25, 0.0]]))


def test_cispo_keeps_gradients_with_a_clipped_detached_weight():
    lp = T([[-1.0, -2.0]]).requires_grad_(True)
    old = lp.detach() - T([[2.0, 0.5]]).log()  # ratios 2.0 and 0.5
    adv = T([[1.0, -1.0]])
    config = dataclasses.replace(CONFIG, clip_ratio_low=1.0)  # upper clip only, as MiniMax-M1
    loss, m = cispo_loss(lp, old, adv, torch.ones(1, 2), config=config, agg=TOKEN_MEAN)
    # weights clip(2.0) = 1.28, 0.5; per token -w A log p = [-1.28 * 1 * -1, -0.5 * -1 * -2]
    # = [1.28, -1.0] -> mean 0.14; gradient -w A / 2 = [-0.64, 0.25]
    assert loss.item() == pytest.approx(0.14)
    assert m["pg_clipfrac_upper"] == pytest.approx(0.5)
    (grad,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(grad, T([[-0.64, 0.25]]))


def test_actor_loss_adds_entropy_bonus_and_kl_term():
    lp = T([[-1.0, -2.0, -3.0]]).requires_grad_(True)
    old = lp.detach().clone()  # ratio 1 everywhere
    adv = T([[1.0, -1.0, 9.0]])
    mask = T([[1, 1, 0]])
    entropy = T([[0.5, 1.5, 7.0]])
    ref = T([[-1.5, -1.0, 0.0]])  # k1 = lp - ref = [0.5, -1.0]
    config = PolicyLossConfig(entropy_coeff=0.1, kl_loss_coef=0.2, kl_loss_kind="k1")
    loss, m = actor_loss(lp, old, adv, mask, config=config, agg=TOKEN_MEAN, entropy=entropy,
                         ref_log_probs=ref)
    # pg = mean(-1, 1) = 0; entropy bonus -0.1 * mean(0.5, 1.5) = -0.1;
    # kl 0.2 * mean(0.5, -1.0) = -0.05 -> total -0.15
    assert loss.item() == pytest.approx(-0.15)
    assert m["loss"] == pytest.approx(-0.15)
    assert m["pg_loss"] == pytest.approx(0.0)
    assert m["entropy"] == pytest.approx(1.0)
    assert m["kl_ref"] == pytest.approx(-0.25)
    (grad,) = torch.autograd.grad(loss, lp)
    # d/d lp: pg -A r / 2 = [-0.5, 0.5]; kl 0.2 * 1 / 2 = 0.1 each -> [-0.4, 0.6, 0]
    torch.testing.assert_close(grad, T([[-0.4, 0.6, 0.0]]))


def test_actor_loss_requires_what_its_coefficients_use():
    lp = T([[-1.0]])
    with pytest.raises(ValueError, match="entropy"):
        actor_loss(lp, lp, lp, T([[1]]), config=PolicyLossConfig(entropy_coeff=0.01),
                   agg=TOKEN_MEAN)
    with pytest.raises(ValueError, match="ref_log_probs"):
        actor_loss(lp, lp, lp, T([[1]]), config=PolicyLossConfig(kl_loss_coef=0.01),
                   agg=TOKEN_MEAN)


def test_value_loss_hand_values():
    values = T([[1.0, 2.0, 0.0]]).requires_grad_(True)
    old = T([[0.5, 2.0, 0.0]])
    returns = T([[2.0, 1.0, 0.3]])
    mask = T([[1, 1, 0]])
    loss, m = value_loss(values, old, returns, mask, 0.2, TOKEN_MEAN)
    # token 0: clipped V = 0.5 + 0.2 = 0.7; max((1 - 2)^2, (0.7 - 2)^2) = 1.69 -> 0.845
    # token 1: unchanged, (2 - 1)^2 = 1 -> 0.5; mean over 2 tokens = 0.6725
    assert loss.item() == pytest.approx(0.6725)
    assert m == pytest.approx({"vf_loss": 0.6725, "vf_clipfrac": 0.5, "vpred_mean": 1.5,
                               "tokens": 2.0})
    (grad,) = torch.autograd.grad(loss, values)
    # token 0 uses the clipped value (constant in V): 0; token 1: (V - G) / 2 = 0.5
    torch.testing.assert_close(grad, T([[0.0, 0.5, 0.0]]))
    unclipped, _ = value_loss(values, old, returns, mask, None, TOKEN_MEAN)
    assert unclipped.item() == pytest.approx((0.5 + 0.5) / 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"loss_agg_mode": "sum"}, "token-mean, seq-mean-token-sum, seq-mean-token-mean, "
                                   "seq-mean-token-sum-norm"),
        ({"kl_loss_kind": "k4"}, "k1, k2, k3, abs"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c"),
        ({"clip_ratio_low": 1.5}, "clip_ratio_low"),
        ({"clip_ratio_high": -0.1}, "clip_ratio_high"),
        ({"corrections": [{"name": "tis", "cap": 0.0}]}, "cap must be > 0"),
        ({"corrections": ["tis", "tis"]}, "one correction twice"),
        ({"corrections": ["nope"]}, "unknown correction 'nope'"),
        ({"kl_loss_coef": -1.0}, "kl_loss_coef"),
        ({"entropy_coeff": math.nan}, "entropy_coeff"),
    ],
)
def test_policy_loss_config_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PolicyLossConfig(**kwargs)


def test_policy_loss_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        CONFIG.clip_ratio_low = 0.1  # type: ignore[misc]
