"""How long an env's code holds the rollout's event loop without yielding (issue 49).

Every episode of a rollout worker runs on one event loop: an env step that runs blocking code
(a sync HTTP call, a long computation) without declaring ``blocking_step`` stops every other
episode, and the engine's requests, until it returns. `held` drives a coroutine one resume at a
time and records the longest stretch it ran between two awaits; `warn_if_held` names the env
in one warning (once per env class and process) with the fix.
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
HOLD_WARN_S = 0.25  # a stretch this long without an await stalls the other episodes visibly
_warned: set[str] = set()


class Hold:
    """The longest stretch (seconds) a coroutine ran without yielding to the loop."""

    longest: float = 0.0

    def note(self, seconds: float) -> None:
        self.longest = max(self.longest, seconds)


@types.coroutine
def held(coro: Awaitable[T], hold: Hold) -> Generator[Any, Any, T]:
    """Await ``coro``, timing each of its resumes into ``hold``; results, exceptions and
    cancellation pass through unchanged."""
    inner = coro.__await__()
    value: Any = None
    error: BaseException | None = None
    while True:
        start = time.perf_counter()
        try:
            yielded = inner.throw(error) if error is not None else inner.send(value)
        except StopIteration as done:
            hold.note(time.perf_counter() - start)
            return done.value
        except BaseException:
            hold.note(time.perf_counter() - start)
            raise
        hold.note(time.perf_counter() - start)
        value, error = None, None
        try:
            value = yield yielded
        except GeneratorExit:
            inner.close()
            raise
        except BaseException as e:  # a cancellation or a thrown error goes to the inner one
            error = e


def timed_call(fn: Callable[..., T], hold: Hold, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, a sync call on the loop, timed into ``hold``."""
    start = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        hold.note(time.perf_counter() - start)


def warn_if_held(env: Any, what: str, hold: Hold, limit: float = HOLD_WARN_S) -> bool:
    """One warning per env class (and process) whose ``what`` held the loop past ``limit``."""
    name = type(env).__name__
    if hold.longest <= limit or name in _warned:
        return False
    _warned.add(name)
    logger.warning("the %s of env %s held the rollout's event loop for %.2f s without yielding: "
                   "every other episode and engine request waited. Set blocking_step = True on "
                   "%s so its reset and step run on a thread (or await its slow calls)",
                   what, name, hold.longest, name)
    return True


def run_coroutine(coro: Coroutine[Any, Any, T], hold: Hold) -> Coroutine[Any, Any, T]:
    """``held`` as a coroutine object (what `asyncio.wait_for` takes)."""
    async def _run() -> T:
        return await held(coro, hold)
    return _run()
