"""Users add advantage estimators and policy losses by name; unknown names fail clearly."""

from __future__ import annotations

import pytest
import torch

from toolrl.algo import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    LossAggregator,
    PolicyLossConfig,
    actor_loss,
    agg_loss,
    compute_advantage,
    register_advantage,
    register_policy_loss,
)
from toolrl.registry import RegistryError

BUILTIN_ESTIMATORS = {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae",
                      "grpo_turn"}


def test_builtins_are_registered():
    assert set(ADVANTAGE_ESTIMATORS.names()) >= BUILTIN_ESTIMATORS
    assert {"ppo_clip", "gspo", "cispo"} <= set(POLICY_LOSSES.names())


@pytest.fixture
def custom_estimator():
    @register_advantage("test_sign")
    def sign_advantage(token_level_rewards, response_mask, **_):
        """Advantage = sign of the sequence return."""
        score = token_level_rewards.sum(-1, keepdim=True)
        adv = torch.sign(score) * response_mask
        return adv, score * response_mask

    yield sign_advantage
    ADVANTAGE_ESTIMATORS.unregister("test_sign")


@pytest.fixture
def custom_loss():
    @register_policy_loss("test_reinforce")
    def reinforce(log_probs, old_log_probs, advantages, response_mask, *, config, agg,
                  rollout_log_probs=None):
        loss = agg(-advantages * log_probs, response_mask)
        return loss, {"pg_loss": loss.item()}

    yield reinforce
    POLICY_LOSSES.unregister("test_reinforce")


def test_custom_estimator_is_looked_up_by_name(custom_estimator):
    assert ADVANTAGE_ESTIMATORS.get("test_sign") is custom_estimator
    rewards = torch.tensor([[0.0, -2.0], [3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # the trainer passes its uniform keyword set; the estimator ignores what it doesn't use
    adv, _ = compute_advantage("test_sign", rewards, mask, uids=["a", "b"], gamma=1.0)
    torch.testing.assert_close(adv, torch.tensor([[-1.0, -1.0], [1.0, 0.0]]))


def test_custom_loss_drives_actor_loss(custom_loss):
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 2.0]])
    mask = torch.ones(1, 2)
    config = PolicyLossConfig(policy_loss="test_reinforce")
    loss, metrics = actor_loss(lp, lp.detach(), adv, mask, config=config,
                               agg=LossAggregator("token-mean"))
    # -(1 * -1 + 2 * -2) / 2 = 2.5
    assert loss.item() == pytest.approx(2.5)
    assert metrics["loss"] == pytest.approx(2.5)
    torch.testing.assert_close(loss, agg_loss(-adv * lp, mask, "token-mean"))


def test_unknown_names_list_the_known_ones():
    with pytest.raises(RegistryError, match=r"unknown advantage estimator 'nope'.*grpo"):
        compute_advantage("nope", torch.zeros(1, 1), torch.ones(1, 1))
    with pytest.raises(RegistryError, match=r"unknown policy loss 'nope'.*ppo_clip"):
        actor_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1),
                   config=PolicyLossConfig(policy_loss="nope"), agg=LossAggregator())


def test_a_name_cannot_be_taken_twice():
    with pytest.raises(RegistryError, match="already registered"):
        register_advantage("grpo")(lambda *a, **k: None)
