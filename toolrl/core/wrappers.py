"""Wrappers for tool envs (`gymnasium.Wrapper` subclasses that keep ``astep`` reachable).

`ToolWrapper` is the base: its ``astep`` calls the nearest ``astep`` down the chain (skipping
gymnasium's own wrappers such as ``OrderEnforcing``, which have none) and its ``step`` runs that
through the env's sync shim. `toolrl.make_env` always returns a `ToolWrapper` on the outside.

- `MaxTurns`: end (truncate) the episode after n assistant turns; the outcome is evaluated.
- `ToolTimeout`: cap every tool call of the wrapped env at n seconds.
- `ObservationBudget`: cut each tool message to a character (or token) budget.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from toolrl.core.env import Message, resolve_astep
from toolrl.core.tools import TRUNCATION_MARKER, make_error

__all__ = ["MaxTurns", "ObservationBudget", "ToolTimeout", "ToolWrapper"]

StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]


class ToolWrapper(gym.Wrapper):
    """Base wrapper for tool envs: forwards ``astep`` and the ToolEnv helpers."""

    async def astep(self, action: str) -> StepResult:
        return await resolve_astep(self.env)(action)

    def step(self, action: str) -> StepResult:
        return self.unwrapped.run_sync(self.astep(action))

    def tools_schema(self) -> list[dict[str, Any]]:
        return self.unwrapped.tools_schema()

    def state_snapshot(self) -> dict[str, Any]:
        return self.unwrapped.state_snapshot()

    def oracle_action(self) -> str:
        return self.unwrapped.oracle_action()


class MaxTurns(ToolWrapper):
    """Truncate the episode after ``max_turns`` assistant turns (the outcome is still scored)."""

    def __init__(self, env: gym.Env, max_turns: int) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        super().__init__(env)
        self.max_turns = max_turns
        self._turns = 0

    def reset(self, **kwargs: Any) -> tuple[list[Message], dict[str, Any]]:
        self._turns = 0
        return super().reset(**kwargs)

    async def astep(self, action: str) -> StepResult:
        observation, reward, terminated, truncated, info = await super().astep(action)
        self._turns += 1
        if not (terminated or truncated) and self._turns >= self.max_turns:
            end = await self.unwrapped.end_episode("max_turns")
            reward += end.pop("outcome_reward")
            info.update(end)
            truncated = True
        return observation, reward, terminated, truncated, info


class ToolTimeout(ToolWrapper):
    """Every tool call of the wrapped env gets at most ``seconds`` (a tool's own limit may be
    lower); a call that runs longer returns a ``timeout`` error observation."""

    def __init__(self, env: gym.Env, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"the tool timeout must be > 0 s, got {seconds}")
        super().__init__(env)
        self.seconds = seconds
        self.unwrapped.tool_timeout = seconds


class ObservationBudget(ToolWrapper):
    """Cut every tool message to ``budget`` characters, or tokens when ``tokenizer`` is given
    (anything with ``encode(text, add_special_tokens=False)`` and ``decode(ids)``); the cut is
    marked in the text and reported as an ``output_truncated`` error in ``info["errors"]``."""

    def __init__(self, env: gym.Env, budget: int, tokenizer: Any = None) -> None:
        if budget < 1:
            raise ValueError(f"the observation budget must be >= 1, got {budget}")
        super().__init__(env)
        self.budget = budget
        self.tokenizer = tokenizer

    def _cut(self, text: str) -> tuple[str, int]:
        """(kept text, number of dropped units)."""
        if self.tokenizer is None:
            return (text, 0) if len(text) <= self.budget else (text[:self.budget],
                                                               len(text) - self.budget)
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= self.budget:
            return text, 0
        return self.tokenizer.decode(ids[:self.budget]), len(ids) - self.budget

    async def astep(self, action: str) -> StepResult:
        observation, reward, terminated, truncated, info = await super().astep(action)
        unit = "tokens" if self.tokenizer is not None else "chars"
        for message in observation:
            if message.get("role") != "tool":
                continue
            kept, dropped = self._cut(message["content"])
            if dropped:
                message["content"] = kept + TRUNCATION_MARKER.format(n=dropped).replace(
                    "chars", unit)
                info.setdefault("errors", []).append(make_error(
                    "output_truncated", message.get("name"),
                    f"observation cut to {self.budget} {unit} ({dropped} dropped)"))
        return observation, reward, terminated, truncated, info


def wrap(env: gym.Env, *, max_turns: int | None = None, tool_timeout: float | None = None,
         observation_budget: int | None = None, tokenizer: Any = None,
         extra: list[Callable[[gym.Env], gym.Env]] | None = None) -> ToolWrapper:
    """Apply the standard wrappers (those given) and make sure ``astep`` is on the outside."""
    if tool_timeout is not None:
        env = ToolTimeout(env, tool_timeout)
    if observation_budget is not None:
        env = ObservationBudget(env, observation_budget, tokenizer)
    if max_turns is not None:
        env = MaxTurns(env, max_turns)
    for fn in extra or ():
        env = fn(env)
    return env if isinstance(env, ToolWrapper) else ToolWrapper(env)
