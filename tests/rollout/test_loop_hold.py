"""An env step that blocks the rollout's event loop is measured and named (issue 49)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from toolrl.rollout import loop_hold
from toolrl.rollout.loop_hold import Hold, held, run_coroutine, timed_call, warn_if_held


async def _step(block_s: float) -> str:
    await asyncio.sleep(0.01)
    time.sleep(block_s)  # sync code between two awaits: the loop is held
    await asyncio.sleep(0.01)
    return "done"


async def _ticks(stop: asyncio.Event) -> float:
    """The longest gap between the ticks of a task that wants to run every 10 ms."""
    worst, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.01)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    return worst


def test_the_longest_stretch_without_an_await_is_measured():
    async def main() -> tuple[str, float, float]:
        stop, hold = asyncio.Event(), Hold()
        ticker = asyncio.create_task(_ticks(stop))
        await asyncio.sleep(0.02)
        out = await held(_step(0.3), hold)
        stop.set()
        return out, hold.longest, await ticker

    out, longest, other_task_waited = asyncio.run(main())
    assert out == "done"
    assert 0.3 <= longest < 1.0
    assert other_task_waited >= 0.3  # the stretch measured is what another task waited


def test_a_step_that_yields_holds_little():
    hold = Hold()
    assert asyncio.run(run_coroutine(_step(0.0), hold)) == "done"
    assert hold.longest < 0.1


def test_errors_and_cancellation_pass_through():
    async def boom() -> None:
        await asyncio.sleep(0)
        raise ValueError("from the env")

    with pytest.raises(ValueError, match="from the env"):
        asyncio.run(run_coroutine(boom(), Hold()))

    async def slow() -> None:
        await asyncio.sleep(10)

    cancelled = []

    async def main() -> None:
        async def watched() -> None:
            try:
                await slow()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
        await asyncio.wait_for(run_coroutine(watched(), Hold()), 0.05)

    with pytest.raises(TimeoutError):
        asyncio.run(main())
    assert cancelled == [True]  # the timeout reached the inner coroutine


def test_a_sync_call_is_timed():
    hold = Hold()
    assert timed_call(lambda x: (time.sleep(0.05), x)[1], hold, 7) == 7
    assert hold.longest >= 0.05


def test_one_warning_per_env_class(caplog, monkeypatch):
    monkeypatch.setattr(loop_hold, "_warned", set())

    class SlowEnv:
        pass

    hold = Hold()
    hold.note(0.8)
    with caplog.at_level(logging.WARNING, logger="toolrl.rollout.loop_hold"):
        assert warn_if_held(SlowEnv(), "step", hold)
        assert not warn_if_held(SlowEnv(), "step", hold)  # once per class
        quick = Hold()
        quick.note(0.01)
        assert not warn_if_held(object(), "step", quick)
    (record,) = caplog.records
    assert "env SlowEnv held the rollout's event loop for 0.80 s" in record.getMessage()
    assert "blocking_step = True" in record.getMessage()
