"""MCP client connections for tool envs, with exact timeouts and no leaked server.

`MCPConnection` holds one MCP client session (the ``mcp`` SDK's `mcp.Client`) on a background
event loop, so its calls can be awaited from any loop. Over stdio it starts the server command
behind toolrl's watchdog, in a process group of its own (`toolrl.core.processes`); over
streamable HTTP it connects to a URL. Its timeouts are exact:

- connect: `open` raises `ConnectionError` once ``connect_timeout`` has passed, not later
  (the half-open session is torn down in the background, within ``shutdown_timeout``);
- per call: `call_tool` gives up after its ``timeout`` and the session stays usable;
- shutdown: `close` returns within ``shutdown_timeout`` (plus ``KILL_S``), and by then the
  server's process group is gone: the SDK closes stdin, then SIGTERMs and SIGKILLs the group;
  past ``shutdown_timeout`` toolrl SIGKILLs the group itself.

`shared_mcp_connection` is the process's one connection to a server (its key: URL or command,
environment, working directory): opened on first use, reused by every env of the process (a
rollout worker's concurrent episodes), reopened after the server died, and closed by
`close_mcp_connections` (a rollout worker's shutdown) or at interpreter exit. A connect
that failed is not retried for ``retry_after`` seconds: the episodes that start meanwhile fail
at once with the same error instead of each waiting ``connect_timeout``.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from toolrl.core.background import BackgroundLoop
from toolrl.core.processes import (
    find_guarded,
    group_alive,
    guarded_command,
    kill_group,
    new_token,
)

__all__ = ["MCPConnection", "close_mcp_connections", "shared_mcp_connection"]

CONNECTION_CLOSED = -32000  # the MCP SDK's code for a session whose transport ended
KILL_S = 2.0  # what killing a process group may add to ``shutdown_timeout``
_loop = BackgroundLoop("toolrl-mcp")


class MCPConnection:
    """One MCP client session: a stdio server this connection starts, or a URL.

    Args:
        target: a streamable-HTTP endpoint (``http://host:port/mcp``) or a stdio command line.
        env: extra environment variables of a stdio server (over the SDK's safe defaults).
        cwd: working directory of a stdio server.
        connect_timeout: seconds to start, connect and list the tools.
        shutdown_timeout: seconds `close` waits for a graceful end before killing the group.
        kill_grace: seconds between SIGTERM and SIGKILL when the owning process dies.
    """

    def __init__(self, target: str | Sequence[str], *, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, connect_timeout: float = 30.0,
                 shutdown_timeout: float = 5.0, kill_grace: float = 1.0) -> None:
        if isinstance(target, str):
            self.url: str | None = target
            self.command: list[str] | None = None
        else:
            self.url, self.command = None, [str(a) for a in target]
            if not self.command:
                raise ValueError("an MCP server command line cannot be empty")
        if connect_timeout <= 0 or shutdown_timeout < 0:
            raise ValueError("connect_timeout must be > 0 and shutdown_timeout >= 0")
        self.env = dict(env or {})
        self.cwd = cwd
        self.connect_timeout = connect_timeout
        self.shutdown_timeout = shutdown_timeout
        self.kill_grace = kill_grace
        self.token = new_token()
        self.tools: list[Any] = []  # the server's `mcp.types.Tool` list, after `open`
        self.pgid: int | None = None  # the stdio server's process group, after `open`
        self.broken = False  # a call found the transport closed (the server died)
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._connected = False  # set on the loop once the session is up
        self._task: asyncio.Task | None = None  # `_hold` on the loop
        self._holder: concurrent.futures.Future | None = None
        self._teardown: concurrent.futures.Future | None = None
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return self.url or " ".join(self.command or [])

    @property
    def is_open(self) -> bool:
        return self._client is not None and self._teardown is None

    @property
    def alive(self) -> bool:
        """Open, no call has found the transport closed, and a stdio server still runs."""
        if not self.is_open or self.broken:
            return False
        return self.pgid is None or group_alive(self.pgid)

    # --- open ------------------------------------------------------------------------------
    def open(self) -> list[Any]:
        """Connect (once) and list the tools; raises `ConnectionError` within
        ``connect_timeout`` (never later) when the server does not answer or fails."""
        with self._lock:
            if self._teardown is not None:
                raise ConnectionError(f"the MCP connection to {self.where} is closed")
            if self._client is not None:
                return self.tools
            ready: concurrent.futures.Future = concurrent.futures.Future()
            self._holder = _loop.submit(self._hold(ready))
            try:
                self._client, self.tools = ready.result(timeout=self.connect_timeout)
            except concurrent.futures.TimeoutError:
                self._begin_teardown()
                raise ConnectionError(f"cannot connect to the MCP server at {self.where}: no "
                                      f"answer within {self.connect_timeout} s") from None
            except BaseException as exc:
                self._begin_teardown()
                raise ConnectionError(f"cannot connect to the MCP server at {self.where}: "
                                      f"{type(exc).__name__}: {exc}") from exc
            if self.command is not None:
                found = find_guarded(self.token)
                self.pgid = found[0] if found else None
            return self.tools

    def _target(self) -> Any:
        if self.url is not None:
            return self.url
        from mcp import StdioServerParameters  # lazy: mcp is heavy (~1.3 s)

        command = guarded_command(self.command or [], self.token, self.kill_grace)
        return StdioServerParameters(command=command[0], args=command[1:], env=self.env or None,
                                     cwd=self.cwd)

    async def _hold(self, ready: concurrent.futures.Future) -> None:
        """Owns the session: enters the client, lists the tools, waits for `close`."""
        from mcp import Client  # lazy: mcp is heavy (~1.3 s)

        self._stop = asyncio.Event()
        self._task = asyncio.current_task()
        try:
            async with Client(self._target()) as client:
                tools, cursor = [], None
                while True:
                    listed = await client.list_tools(cursor=cursor)
                    tools.extend(listed.tools)
                    cursor = listed.next_cursor
                    if not cursor:
                        break
                self._connected = True
                ready.set_result((client, tools))
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    # --- calls -----------------------------------------------------------------------------
    async def call_tool(self, name: str, arguments: dict[str, Any],
                        timeout: float | None = None) -> Any:
        """``tools/call`` on the session (from any event loop); the SDK's `CallToolResult`.

        Raises `TimeoutError` after ``timeout`` s (the request is cancelled, the session
        stays usable) and the SDK's ``MCPError`` when the server is gone.
        """
        client = self._client
        if client is None or self._teardown is not None:
            raise ConnectionError(f"the MCP connection to {self.where} is not open")
        try:
            return await asyncio.wait_for(_loop.run(client.call_tool(name, arguments)), timeout)
        except Exception as exc:
            if getattr(exc, "code", None) == CONNECTION_CLOSED:
                self.broken = True
            raise

    # --- close -----------------------------------------------------------------------------
    def _begin_teardown(self) -> concurrent.futures.Future:
        """Start ending the session (idempotent); the future is done when it has ended."""
        if self._teardown is None:
            self._teardown = _loop.submit(self._end())
            with _ending_lock:
                _ending.add(self)
            self._teardown.add_done_callback(lambda _: _forget(self))
        return self._teardown

    async def _end(self) -> None:
        if self._holder is None:
            return
        await asyncio.sleep(0)  # let a just-submitted `_hold` start
        task = self._task
        if task is None:  # never started
            self._holder.cancel()
            return
        if self._connected and self._stop is not None:
            self._stop.set()  # graceful: the SDK closes stdin, then SIGTERM/SIGKILL
        else:
            task.cancel()  # still connecting: cancelling runs the SDK's same teardown
        done, _ = await asyncio.wait({task}, timeout=self.shutdown_timeout)
        if not done:
            for pgid in find_guarded(self.token) or ([self.pgid] if self.pgid else []):
                await asyncio.to_thread(kill_group, pgid)
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        # the SDK may have given up on a survivor; the group must still go
        for pgid in find_guarded(self.token):
            await asyncio.to_thread(kill_group, pgid)

    def close(self) -> None:
        """End the session; returns within ``shutdown_timeout`` plus ``KILL_S`` (the kill), with
        the stdio server's process group gone. Idempotent."""
        with self._lock:
            teardown = self._begin_teardown()
            self._client = None
        if _loop.on_loop():
            return  # cannot block the loop the teardown runs on
        with contextlib.suppress(concurrent.futures.TimeoutError, Exception):
            teardown.result(timeout=self.shutdown_timeout + KILL_S)

    async def aclose(self) -> None:
        """`close` from an event loop (does not block it)."""
        with self._lock:
            teardown = self._begin_teardown()
            self._client = None
        with contextlib.suppress(asyncio.TimeoutError, Exception):
            await asyncio.wait_for(asyncio.wrap_future(teardown),
                                   self.shutdown_timeout + KILL_S)


# --- one connection per server and process -----------------------------------------------
_shared: dict[tuple, MCPConnection] = {}
_ending: set[MCPConnection] = set()  # teardowns begun and not waited for (failed connects)
_ending_lock = threading.Lock()
_failed: dict[tuple, tuple[float, ConnectionError]] = {}
_shared_lock = threading.Lock()


def _key(target: str | Sequence[str], env: Mapping[str, str] | None,
         cwd: str | None) -> tuple:
    where = target if isinstance(target, str) else tuple(str(a) for a in target)
    return where, tuple(sorted((env or {}).items())), cwd


def shared_mcp_connection(target: str | Sequence[str], *, env: Mapping[str, str] | None = None,
                      cwd: str | None = None, connect_timeout: float = 30.0,
                      shutdown_timeout: float = 5.0, retry_after: float = 5.0) -> MCPConnection:
    """This process's open connection to the server ``target`` (see `MCPConnection`): the
    same one for every caller, reopened when the last one died. Raises `ConnectionError`
    (at once while a connect of the last ``retry_after`` s failed)."""
    key = _key(target, env, cwd)
    with _shared_lock:
        conn = _shared.get(key)
        if conn is not None and conn.alive:
            return conn
        if conn is not None:
            del _shared[key]
            conn._begin_teardown()
        failed = _failed.get(key)
        if failed is not None and time.monotonic() - failed[0] < retry_after:
            raise ConnectionError(f"{failed[1]} (failed {time.monotonic() - failed[0]:.1f} s "
                                  f"ago; retried after {retry_after} s)")
        conn = MCPConnection(target, env=env, cwd=cwd, connect_timeout=connect_timeout,
                             shutdown_timeout=shutdown_timeout)
        try:
            conn.open()
        except ConnectionError as exc:
            _failed[key] = (time.monotonic(), exc)
            raise
        _failed.pop(key, None)
        _shared[key] = conn
        return conn


def _forget(conn: MCPConnection) -> None:
    with _ending_lock:
        _ending.discard(conn)


def close_mcp_connections() -> None:
    """Close every shared connection of this process and finish every teardown under way
    (failed connects, dead sessions): their servers' groups are gone when this returns."""
    with _shared_lock:
        conns = list(_shared.values())
        _shared.clear()
        _failed.clear()
    with _ending_lock:
        conns += [c for c in _ending if c not in conns]
    for conn in conns:
        conn._begin_teardown()
    for conn in conns:
        conn.close()


atexit.register(close_mcp_connections)


def _after_fork_in_child() -> None:
    # a forked child shares none of the parent's sessions, servers or loop thread
    global _loop
    _loop = BackgroundLoop("toolrl-mcp")
    _shared.clear()
    _ending.clear()
    _failed.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
