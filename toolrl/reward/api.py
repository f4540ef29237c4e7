"""What a reward plugin author writes: the `reward` decorator, `RewardResult`, the protocols.

Writing a reward::

    from toolrl import RewardResult, Trajectory, reward

    @reward("short_answer")
    def short_answer(traj: Trajectory, *, limit: int = 200) -> float:
        text = traj.messages[-1].get("content") or ""
        return 1.0 if len(text) <= limit else 0.0

A reward is a function (or a class, instantiated with the config's ``kwargs``) called with one
finished `toolrl.core.trajectory.Trajectory` (its turns carry the env's parse of every action:
read ``traj.calls`` / ``traj.parses()`` / ``turn.parse``, never parse again); it returns a float
or a `RewardResult` and may be ``async``. With ``@reward(name, batched=True)`` a function
receives the whole list of trajectories and returns a list (an element may be an exception:
that sample alone gets the fallback); a class gets the batched form by defining
``batch(self, trajs)``. Third-party packages register through the ``toolrl.rewards``
entry-point group. Composition (weights, gates, clipping, the executor) is
`toolrl.reward.compose`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from toolrl.core.trajectory import Trajectory
from toolrl.registry import Registry

__all__ = ["REWARDS", "BatchedRewardFn", "RewardError", "RewardFn", "RewardResult",
           "RewardSpec", "Score", "get_reward_spec", "reward"]


@dataclass(frozen=True)
class RewardResult:
    """A score with optional named sub-scores, per-turn scores and a reason (why it failed)."""

    score: float
    components: dict[str, float] = field(default_factory=dict)
    per_turn: list[float] | None = None
    reason: str = ""


Score = float | RewardResult


@runtime_checkable
class RewardFn(Protocol):
    """Scores one finished trajectory; may be ``async``."""

    def __call__(self, traj: Trajectory, /) -> Score | Awaitable[Score]: ...


@runtime_checkable
class BatchedRewardFn(Protocol):
    """Scores a list of trajectories at once (an element may be an exception)."""

    def batch(self, trajs: list[Trajectory], /) -> Sequence[Score | BaseException] | Awaitable[
            Sequence[Score | BaseException]]: ...


@dataclass(frozen=True)
class RewardSpec:
    """A registered reward: its id, the function or class, and whether it takes a batch."""

    name: str
    target: Callable[..., Any]
    batched: bool = False

    @property
    def description(self) -> str:
        doc = inspect.getdoc(self.target) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""


REWARDS: Registry[RewardSpec] = Registry("reward", group="toolrl.rewards")


def reward(name: str, *, batched: bool = False) -> Callable[[Callable[..., Any]], Any]:
    """Register a reward function or class under ``name``; returns it unchanged."""

    def decorator(target: Callable[..., Any]) -> Callable[..., Any]:
        REWARDS.register(name, RewardSpec(name=name, target=target, batched=batched))
        return target

    return decorator


def get_reward_spec(name: str) -> RewardSpec:
    """The spec registered as ``name`` (a raw callable from an entry point is wrapped)."""
    obj = REWARDS.get(name)
    return obj if isinstance(obj, RewardSpec) else RewardSpec(name=name, target=obj)


class RewardError(RuntimeError):
    """A reward raised, timed out or returned something that is not a finite score."""
