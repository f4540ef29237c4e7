"""Held-out success counts episodes, not samples: an episode split into several training samples
(``per_turn``, a gateway agent that rewrites its history) is one episode in validation and in
`toolrl eval`, as it is in the training metrics. Counted by samples, a think-stripping run's
``val/success`` was a mean over 128 to 267 rows for 128 episodes."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from toolrl import batch as B
from toolrl.core.trajectory import TokenStream, Trajectory
from toolrl.rollout.samples import episode_rows
from toolrl.trainer import evaluate
from toolrl.trainer.trainer import Trainer


def _episodes() -> list[Trajectory]:
    """Three episodes: one won in three per-turn samples, two lost in one sample each."""
    won = Trajectory(success=True, row={"id": "a"}, extra={"per_turn": {}})
    lost = [Trajectory(success=False, row={"id": i}) for i in ("b", "c")]
    turns = [TokenStream([1, 2], [3], [1], [-0.5]) for _ in range(3)]
    _, _, split = episode_rows([won.row], ["a"], [(won, turns)], key="per_turn")
    return [*split, *lost]


def _batch(trajs: list[Trajectory]) -> object:
    n = len(trajs)
    td = B.build_rollout_batch([[1, 2]] * n, [[3]] * n, [[1]] * n, pad_token_id=0,
                               non_tensor={B.TRAJECTORIES: trajs})
    td[B.TOKEN_LEVEL_SCORES] = torch.tensor([[float(t.success)] for t in trajs])
    return td


def _run() -> SimpleNamespace:
    reward = SimpleNamespace(score=lambda trajs, envs: (
        [SimpleNamespace(score=float(t.success)) for t in trajs], {}))
    return SimpleNamespace(
        rollout=lambda rows, n, seed=None, greedy=False: _batch(_episodes()),
        seed_of=lambda name: 0, score=lambda batch: None, mixed=False, reward=reward,
        envs_of=lambda trajs: [None] * len(trajs), val_rows=[{}] * 3,
        cfg=SimpleNamespace(rollout=SimpleNamespace(val_temperature=0.0, concurrency=8)))


def test_split_episodes_would_read_otherwise():
    samples = _episodes()
    assert len(samples) == 5 and sum(t.success for t in samples) / len(samples) == 0.6


def test_validation_counts_each_episode_once():
    out = Trainer.validate(_run())
    assert out["val/success"] == 1 / 3 and out["val/reward_mean"] == 1 / 3


def test_eval_counts_each_episode_once(monkeypatch):
    trajs, scores, _ = evaluate._play(_run(), [{}] * 3, 1, console=SimpleNamespace(
        log=lambda *_: None))
    assert [t.row["id"] for t in trajs] == ["a", "b", "c"] and scores == [1.0, 0.0, 0.0]
