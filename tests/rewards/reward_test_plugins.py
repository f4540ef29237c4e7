"""Rewards registered only for the tests (importable by pool processes through sys.path)."""

from __future__ import annotations

import asyncio
import os

from toolrl.core.trajectory import Trajectory
from toolrl.reward import RewardResult, reward


@reward("t_value")
def t_value(traj: Trajectory, *, key: str = "a") -> float:
    """The value stored in the row under values[key]."""
    return traj.row["values"][key]


@reward("t_fail_on")
def t_fail_on(traj: Trajectory, *, ids: tuple = ()) -> float:
    """Raises on the listed sample ids, else 1.0."""
    if traj.id in ids:
        raise RuntimeError(f"boom on {traj.id}")
    return 1.0


@reward("t_async")
async def t_async(traj: Trajectory, *, delay: float = 0.0) -> RewardResult:
    """Async: sleeps, then returns values['a'] with a sub-score and per-turn list."""
    await asyncio.sleep(delay)
    value = traj.row["values"]["a"]
    return RewardResult(value, components={"half": value / 2}, per_turn=[value, -value])


@reward("t_batched", batched=True)
def t_batched(trajs: list[Trajectory], *, fail_ids: tuple = ()) -> list:
    """Batched: values['b'] per sample; an exception object for the listed ids."""
    return [ValueError(f"bad {t.id}") if t.id in fail_ids else t.row["values"]["b"]
            for t in trajs]


@reward("t_wrong_length", batched=True)
def t_wrong_length(trajs: list[Trajectory]) -> list[float]:
    """Batched, but returns one result too few."""
    return [1.0] * (len(trajs) - 1)


@reward("t_nonfinite")
def t_nonfinite(traj: Trajectory) -> float:
    """Returns NaN."""
    return float("nan")


@reward("t_not_a_number")
def t_not_a_number(traj: Trajectory) -> str:
    """Returns a string."""
    return "high"


@reward("t_pid")
def t_pid(traj: Trajectory) -> float:
    """The id of the process that ran it."""
    return float(os.getpid())


@reward("t_crash_process")
def t_crash_process(traj: Trajectory) -> float:
    """Kills its own process (a segfaulting reward)."""
    os._exit(3)


@reward("t_counter")
class Counter:
    """A class reward with state and config validated in __init__."""

    def __init__(self, start: float = 0.0, step: float = 1.0) -> None:
        if step <= 0:
            raise ValueError("step must be > 0")
        self.value, self.step = start, step

    def __call__(self, traj: Trajectory) -> float:
        self.value += self.step
        return self.value


_ACTIVE = [0, 0]  # running now, most ever running at once


@reward("t_concurrency")
async def t_concurrency(traj: Trajectory) -> float:
    """Async: how many calls of this reward ran at once (at most) while this one ran."""
    _ACTIVE[0] += 1
    _ACTIVE[1] = max(_ACTIVE[1], _ACTIVE[0])
    await asyncio.sleep(0.05)
    _ACTIVE[0] -= 1
    return float(_ACTIVE[1])


def reset_concurrency() -> None:
    _ACTIVE[:] = [0, 0]
