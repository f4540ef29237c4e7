"""Validation reports the configured reward and the env's success under distinct names; the
rollout is the env's own episodes (an oracle and a no-call policy), the scoring the trainer's."""

from __future__ import annotations

import asyncio

import pytest
from tensordict import TensorDict

import toolrl
from toolrl import batch as B
from toolrl.trainer.config import (
    ConfigError,
    ExperimentConfig,
    TrainerConfig,
    load_config,
    validate,
    validates_after,
)
from toolrl.trainer.trainer import Trainer


def test_validate_reports_the_configured_reward_apart_from_success(monkeypatch):
    env = toolrl.make_env("toolrl/Calculator-v0")
    trajs = [asyncio.run(toolrl.run_episode(env, seed=0)),  # the oracle: success
             asyncio.run(toolrl.run_episode(env, lambda e, m: "No idea.", seed=1))]
    env.close()
    cfg = load_config(None, ["reward.rewards=[{name: success, weight: 2.0}, "
                             "{name: turn_penalty, kwargs: {penalty: 0.5, free_turns: 0}}]",
                             "data.val_size=2"])
    trainer = Trainer(cfg)
    try:
        trainer.val_rows = [t.row for t in trajs]
        batch = TensorDict({}, batch_size=[2])
        B.set_non_tensor(batch, B.TRAJECTORIES, trajs)
        monkeypatch.setattr(trainer, "rollout", lambda rows, n, seed, greedy: batch)
        out = trainer.validate()
    finally:
        trainer.close()
    assert out["val/success"] == 0.5
    # 2 x success - 0.5 per turn: (2 - 1) for the oracle's 2 turns, (0 - 0.5) for 1 turn
    assert out["val/reward_mean"] == 0.25
    assert out["val/reward/success"] == 0.5 and out["val/reward/turn_penalty"] == -0.75
    assert out["val/reward/errors/success"] == 0.0
    assert out["val/env_reward_mean"] == 0.5  # what the env's steps returned


@pytest.mark.parametrize(("every", "total", "steps"), [
    (5, 12, [0, 5, 10, 12]),  # before, every 5, after the last
    (4, 12, [0, 4, 8, 12]),
    (12, 12, [0, 12]),  # before and after only
    (0, 12, []),  # never means never (issue 49)
])
def test_validation_steps(every, total, steps):
    cfg = TrainerConfig(val_every=every, total_steps=total)
    assert [s for s in range(total + 1) if validates_after(s, cfg)] == steps


def test_a_negative_val_every_is_refused():
    with pytest.raises(ConfigError, match=r"trainer\.val_every must be >= 0, got -1"):
        validate(ExperimentConfig(trainer=TrainerConfig(val_every=-1)))
