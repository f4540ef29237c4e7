"""Validation reports the configured reward and the env's success under distinct names; the
rollout is the env's own episodes (an oracle and a no-call policy), the scoring the trainer's."""

from __future__ import annotations

import asyncio

from tensordict import TensorDict

import toolrl
from toolrl import batch as B
from toolrl.trainer.config import load_config
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
