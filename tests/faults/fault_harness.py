"""Shared pieces of the fault-injection suite (tests/faults/).

- `FaultEnv` ("toolrl-faults/Fault-v0"): a tool env whose tools misbehave on purpose (raise,
  hang, return 10 MB, return bytes that are not UTF-8, return values that are not JSON) and
  whose reset / step / close can be told to raise. Which calls a turn makes comes from the
  task row (``row["calls"][turn]``), not from the model's text, so the same rows drive a
  scripted policy and a real vLLM engine alike.
- `play_batch`: run many episodes at once, bounded in time, and check that every episode that
  went in came out exactly once (`assert_conserved`).
- `serve_asgi`: a real uvicorn server on 127.0.0.1 for a tiny ASGI app (faulty HTTP services);
  `server_process`: a server script in a subprocess that prints ``listening on URL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from toolrl.core.env import ToolEnv, Turn, run_episode
from toolrl.core.parse import ToolCallFormat
from toolrl.core.registration import register_env
from toolrl.core.tools import tool
from toolrl.core.trajectory import Trajectory
from toolrl.core.types import ParseResult, ToolCall

FAULT_ENV = "toolrl-faults/Fault-v0"
TEN_MB = 10 * 1024 * 1024
NOT_UTF8 = b"caf\xe9 \xff\xfe\x80 end"  # Latin-1 and stray bytes: invalid UTF-8
# Released by the suite's teardown, so the threads of hung sync tools end eventually.
RELEASE_HUNG_TOOLS = threading.Event()


def call(name: str, **arguments: Any) -> str:
    """A Hermes-format tool call (what the tiny model's template renders)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class RowScriptFormat(ToolCallFormat):
    """Ignores the message text: turn ``t`` makes the calls in ``row["calls"][t]``."""

    name = "row-script"

    def __init__(self, env: FaultEnv) -> None:
        super().__init__()
        self.env = env

    def _parse(self, text: str) -> ParseResult:
        script = (self.env.row or {}).get("calls") or []
        turn = self.env.turn - 1  # astep has counted this turn already
        calls = script[turn] if turn < len(script) else []
        return ParseResult(calls=[ToolCall(c["name"], c.get("arguments", {})) for c in calls],
                           text=text)


class Opaque:
    """A return value JSON cannot encode (rendered with ``str``)."""

    def __str__(self) -> str:
        return "<opaque value>"


class FaultEnv(ToolEnv):
    """Tools that misbehave on request; reset/step/close raise when the row says so.

    Row fields: ``id``, ``question``, ``calls`` (list per turn of ``{"name", "arguments"}``),
    optional ``fail`` (``"reset"``, ``"step"`` (on turn ``fail_turn``, default 1),
    ``"close"``, ``"bad_text"`` (the env's own follow-up message holds a lone surrogate)).
    The episode ends on the first turn without calls; success means the ``echo`` tool ran
    after the faulty call (the env kept working).
    """

    default_max_turns = 6
    default_tool_timeout = 0.5

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.parser = RowScriptFormat(self)
        self.echoed: list[str] = []

    @classmethod
    def make_tasks(cls, n: int, seed: int = 0, split: str = "train",
                   **kwargs: Any) -> list[dict[str, Any]]:
        return [fault_row(f"fault-{split}-{seed}-{i}", "echo") for i in range(n)]

    def setup(self, row: dict[str, Any]) -> None:
        if row.get("fail") == "reset":
            raise RuntimeError(f"injected reset failure in {row['id']}")
        self.echoed = []

    @tool
    def boom(self) -> str:
        """Always raises."""
        raise RuntimeError("kaboom")

    @tool
    def hang_sync(self) -> str:
        """Blocks its thread (until the suite ends)."""
        RELEASE_HUNG_TOOLS.wait(600)
        return "released"

    @tool
    async def hang_async(self) -> str:
        """Never answers."""
        await asyncio.Event().wait()
        return "never"

    @tool
    def huge(self, kind: str) -> Any:
        """Returns 10 MB.

        Args:
            kind: text, bytes or json
        """
        if kind == "text":
            return "x" * TEN_MB
        if kind == "bytes":
            return b"y" * TEN_MB
        return {"rows": ["z" * 1024] * (TEN_MB // 1024)}

    @tool
    def not_utf8(self, kind: str) -> Any:
        """Returns bytes that are not UTF-8, raw or decoded with surrogateescape.

        Args:
            kind: bytes or surrogates
        """
        return NOT_UTF8 if kind == "bytes" else NOT_UTF8.decode("utf-8", "surrogateescape")

    @tool
    def not_json(self, kind: str) -> Any:
        """Returns something JSON cannot encode, or an int too long to print.

        Args:
            kind: set, object or huge_int
        """
        if kind == "set":
            return {3, 1, 2}
        if kind == "object":
            return Opaque()
        return 10 ** 5000

    @tool(inline=True)
    def echo(self, text: str) -> str:
        """Returns the text.

        Args:
            text: anything
        """
        self.echoed.append(text)
        return text

    async def astep(self, action: str) -> tuple:
        row = self.row or {}
        if row.get("fail") == "step" and self.turn + 1 == row.get("fail_turn", 1):
            raise RuntimeError(f"injected step failure in {row['id']} on turn {self.turn + 1}")
        return await super().astep(action)

    def on_turn(self, parse: ParseResult, results: list[Any]) -> Turn:
        messages = []
        if (self.row or {}).get("fail") == "bad_text":
            messages = [{"role": "user", "content": "next \udc80 please"}]
        return Turn(messages=messages, terminated=not parse.calls)

    def evaluate(self) -> bool:
        return "still here" in self.echoed

    def state_snapshot(self) -> dict[str, Any]:
        return {"echoed": list(self.echoed)}

    def oracle_action(self) -> str:
        return "next"  # the row's script decides the calls

    def close(self) -> None:
        if (self.row or {}).get("fail") == "close":
            raise RuntimeError(f"injected close failure in {self.row['id']}")
        super().close()


register_env(FAULT_ENV, FaultEnv)


def fault_row(row_id: str, tool_name: str, fail: str | None = None, **arguments: Any
              ) -> dict[str, Any]:
    """Turn 1 calls ``tool_name``, turn 2 calls ``echo("still here")``, turn 3 answers."""
    row: dict[str, Any] = {"id": row_id, "question": f"fault {row_id}",
                           "calls": [[{"name": tool_name, "arguments": arguments}],
                                     [{"name": "echo", "arguments": {"text": "still here"}}],
                                     []]}
    if fail is not None:
        row["fail"] = fail
    return row


# --- counting episodes -------------------------------------------------------------------------
def assert_conserved(ids_in: Iterable[Any], ids_out: Iterable[Any]) -> None:
    """Every episode that went in came out exactly once: none lost, none duplicated (ids are
    compared as multisets, so a task sampled n times must come back n times)."""
    ids_in, ids_out = list(ids_in), list(ids_out)
    lost = Counter(ids_in) - Counter(ids_out)
    extra = Counter(ids_out) - Counter(ids_in)
    assert not lost and not extra, f"lost {dict(lost)}, duplicated or unknown {dict(extra)}"


async def play_batch(make_env: Callable[[], Any], rows: Sequence[dict[str, Any]],
                     policy: Callable[..., Any] | None = None, *,
                     timeout: float = 60.0) -> dict[str, Trajectory]:
    """Play one episode per row concurrently (a fresh env each), within ``timeout`` seconds;
    returns ``{row id: Trajectory}`` after checking that none was lost or duplicated."""
    async def one(row: dict[str, Any]) -> tuple[str, Trajectory]:
        env = make_env()
        try:
            kwargs = {"policy": policy} if policy is not None else {}
            return row["id"], await run_episode(env, row=row, **kwargs)
        finally:
            env.close()

    out = await asyncio.wait_for(asyncio.gather(*(one(r) for r in rows)), timeout)
    assert_conserved([r["id"] for r in rows], [i for i, _ in out])
    return dict(out)


def turn_errors(episode: Trajectory, turn: int = 0) -> list[str]:
    """The typed error kinds of one turn."""
    return [e["type"] for e in episode.turns[turn].errors]


# --- a real HTTP server for a tiny ASGI app ----------------------------------------------------
@contextlib.contextmanager
def serve_asgi(app: Callable[..., Any], timeout: float = 20.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (a free port) on a thread; yields the URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name="toolrl-fault-http")
    thread.start()
    try:
        waited = 0.0
        while not server.started and thread.is_alive() and waited < timeout:
            thread.join(0.02)
            waited += 0.02
        if not server.started:
            raise RuntimeError(f"the test HTTP server did not start within {timeout} s")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@contextlib.contextmanager
def server_process(args: Sequence[str], timeout: float = 60.0
                   ) -> Iterator[tuple[subprocess.Popen, str]]:
    """Run ``python args...`` until its ``listening on URL`` line; yields (process, URL) and
    kills the process afterwards (if the test has not already)."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = None
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            while url is None and time.monotonic() < deadline and proc.poll() is None:
                if selector.select(timeout=max(0.0, deadline - time.monotonic())):
                    line = proc.stdout.readline()
                    if line.startswith("listening on "):
                        url = line.split("listening on ", 1)[1].strip()
        if url is None:
            raise RuntimeError(f"server {args} did not start within {timeout} s")
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
