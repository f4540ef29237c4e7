"""`BackgroundLoop`: an asyncio event loop on a daemon thread, shared by everything that must
outlive one caller's loop (an MCP session, a vLLM engine)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["BackgroundLoop"]

T = TypeVar("T")


class BackgroundLoop:
    """An asyncio loop on a daemon thread, for resources that outlive one caller's loop (an
    MCP session, a local server, a vLLM engine). `run` awaits a coroutine on it from any loop;
    `run_sync` blocks. Started lazily (or by `start`); `stop` is final: using the loop after it
    raises ``error``."""

    def __init__(self, name: str = "toolrl-bg",
                 error: type[Exception] = RuntimeError) -> None:
        self.name = name
        self.error = error
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._stopped:
                raise self.error(f"{self.name} has been shut down")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def main() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=main, name=self.name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def start(self) -> BackgroundLoop:
        """Start the thread now (instead of at first use)."""
        _ = self.loop
        return self

    @property
    def started(self) -> bool:
        return self._loop is not None

    def on_loop(self) -> bool:
        """Whether the calling thread is the loop's own thread (blocking there deadlocks)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def call_soon(self, callback: Callable[[], Any]) -> None:
        """Schedule a plain callback on the loop (thread-safe)."""
        self.loop.call_soon_threadsafe(callback)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        try:
            loop = self.loop
        except Exception:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the background loop (cancelling the caller cancels it there)."""
        if self._loop is not None and asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def run_sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"{self.name}: no result within {timeout} s") from None

    def stop(self, timeout: float = 30.0) -> None:
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
            self._stopped = True
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout)
        if not loop.is_running():
            loop.close()
