"""Blocking tool calls run on reused daemon threads (`in_daemon_thread`): a thread per call cost
more than the call. A call that never returns keeps only its own thread; idle threads end; a
forked child starts with none of the parent's."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from toolrl.core import tools
from toolrl.core.tools import _DaemonWorkers, in_daemon_thread


def _tool_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("toolrl-")}


def test_sequential_calls_reuse_one_thread_and_keep_context_and_errors():
    async def main() -> None:
        before = _tool_threads()
        names = [await in_daemon_thread(lambda: threading.current_thread().name)
                 for _ in range(50)]
        assert len(_tool_threads() - before) <= 1
        assert set(names) == {"toolrl-tool-<lambda>"}
        with pytest.raises(ZeroDivisionError):
            await in_daemon_thread(lambda: 1 / 0)
        assert await in_daemon_thread(sum, [1, 2, 3]) == 6  # the thread survived the error

    asyncio.run(main())


def test_a_call_that_never_returns_holds_only_its_own_thread():
    release = threading.Event()

    async def main() -> None:
        hung = in_daemon_thread(release.wait)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(hung), 0.2)
        # concurrent calls while one thread is stuck: each gets a thread and all finish
        got = await asyncio.wait_for(asyncio.gather(
            *(in_daemon_thread(time.sleep, 0.05) for _ in range(4))), 5)
        assert got == [None] * 4
        release.set()
        assert await asyncio.wait_for(hung, 5) is True

    asyncio.run(main())


def test_idle_threads_end():
    workers = _DaemonWorkers(idle_s=0.1)
    done = threading.Event()
    workers.submit(lambda: done.set)
    assert done.wait(5)
    deadline = time.monotonic() + 5
    while workers._idle and time.monotonic() < deadline:
        time.sleep(0.02)
    assert workers._idle == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_threads():
    async def call(fn):
        return await asyncio.wait_for(in_daemon_thread(fn), 5)

    asyncio.run(call(int))  # the parent now holds an idle thread
    assert tools._WORKERS._idle
    pid = os.fork()
    if pid == 0:  # the child: the parent's idle thread does not exist here
        try:
            ok = asyncio.run(call(lambda: 7)) == 7
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
