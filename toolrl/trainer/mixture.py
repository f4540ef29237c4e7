"""Several environments in one run: task rows of each env, a reward set per env, and the
per-env metrics.

A row runs in its own ``env`` (with its ``env_kwargs``) when it names one, else in the
config's ``env.id``. `mixture_rows` adds the rows of ``data.mixture`` sources (stamped with
their env); `RewardSets` scores each row with its env's reward set from ``env_rewards``, else
with ``reward``; `success_by` gives ``<prefix>/<env or category>`` success rates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from toolrl.core.trajectory import Trajectory
from toolrl.data import load_rows
from toolrl.reward import ComposedReward, RewardFailure, RewardResult, build_reward

Row = dict[str, Any]


def source_rows(env_id: str, file: str | None, size: int, seed: int, split: str,
                task_kwargs: Mapping[str, Any], make_tasks: Callable[..., list[Row]] | None
                ) -> list[Row]:
    """The rows of one source: its file, else ``size`` rows of its env's generator."""
    if file:
        return load_rows(file)
    if make_tasks is None:
        raise ValueError(f"{env_id}: no task file and no generator")
    return make_tasks(size, seed=seed, split=split, **dict(task_kwargs))


def mixture_rows(sources: Sequence[Any], seed: int, env_class: Callable[[str], Any]
                 ) -> tuple[list[Row], list[Row]]:
    """(train, val) rows of the ``data.mixture`` sources, each stamped with its env (and
    ``env_kwargs``) unless the row names its own env."""
    train: list[Row] = []
    val: list[Row] = []
    for source in sources:
        make_tasks = None
        if not (source.train_file and source.val_file):
            make_tasks = env_class(source.env).make_tasks
        for split, file, size, out in (("train", source.train_file, source.train_size, train),
                                       ("val", source.val_file, source.val_size, val)):
            for row in source_rows(source.env, file, size, seed, split, source.task_kwargs,
                                   make_tasks):
                if not row.get("env"):
                    row["env"] = source.env
                    if source.env_kwargs:
                        row["env_kwargs"] = dict(source.env_kwargs)
                out.append(row)
    return train, val


class RewardSets:
    """The run's reward and per-env overrides (``env_rewards``); scores a batch env by env.

    Metrics: rows scored by the default set report ``reward/<alias>`` as before; rows of an
    env with its own set report ``reward/<env>/<alias>``; ``reward/total`` is over all rows.
    """

    def __init__(self, default: Any, per_env: Mapping[str, Any] | None = None) -> None:
        self.default: ComposedReward = build_reward(default)
        self.per_env: dict[str, ComposedReward] = {}
        self.last_failures: list[RewardFailure] = []  # of the last `score` call
        try:
            for env_id, cfg in (per_env or {}).items():
                self.per_env[env_id] = build_reward(cfg)
        except BaseException:
            self.close()
            raise

    def score(self, trajs: Sequence[Trajectory], envs: Sequence[str]
              ) -> tuple[list[RewardResult], dict[str, float]]:
        """One `RewardResult` per trajectory (in order) and the batch's reward metrics."""
        groups: dict[str | None, list[int]] = {}
        for i, env in enumerate(envs):
            groups.setdefault(env if env in self.per_env else None, []).append(i)
        results: list[RewardResult | None] = [None] * len(trajs)
        metrics: dict[str, float] = {}
        self.last_failures = []
        for env, indices in groups.items():
            fn = self.default if env is None else self.per_env[env]
            batch = fn.score([trajs[i] for i in indices])
            self.last_failures += batch.failures
            for i, result in zip(indices, batch.results(), strict=True):
                results[i] = result
            prefix = "reward/" if env is None else f"reward/{env}/"
            metrics.update({prefix + k.removeprefix("reward/"): v
                            for k, v in batch.metrics().items()})
        done = [r for r in results if r is not None]
        metrics["reward/total"] = sum(r.score for r in done) / max(len(done), 1)
        return done, metrics

    def close(self) -> None:
        for fn in (self.default, *self.per_env.values()):
            fn.close()


def success_by(prefix: str, trajs: Sequence[Trajectory], keys: Sequence[str]
               ) -> dict[str, float]:
    """``{f"{prefix}/{key}": success rate}`` over the trajectories grouped by ``keys``."""
    groups: dict[str, list[bool]] = {}
    for traj, key in zip(trajs, keys, strict=True):
        groups.setdefault(key, []).append(traj.success)
    return {f"{prefix}/{key}": sum(v) / len(v) for key, v in sorted(groups.items())}
