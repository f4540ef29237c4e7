"""toolrl/MCP-v0: tools discovered from an MCP server with the ``mcp`` SDK.

The env connects once (on its first reset) and keeps the session open until ``close()``: over
stdio it spawns the server as a subprocess (default: the shipped textkit server,
``server.py``; or any ``command``), over streamable HTTP it connects to ``url``. The session
lives on a background event loop (`BackgroundLoop`), so ``astep`` works from any loop and the
sync ``step`` shim too. Each MCP tool's ``inputSchema`` becomes the tool's parameters (validated
before the call); an ``isError`` result becomes a ``tool_exception`` observation. A local
``submit(answer)`` tool ends the episode.

Tasks ask for a text fact the tools compute; success = the submitted answer equals
``ground_truth`` (numbers compared numerically). Row fields: ``id``, ``category``,
``question``, ``ground_truth``, ``oracle_calls``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import sys
from pathlib import Path
from typing import Any

from toolrl import BackgroundLoop, SubmitAnswer, Tool, ToolCall, ToolFailure, submit_tool

SERVER_SCRIPT = Path(__file__).with_name("server.py")
SYSTEM_PROMPT = "Use the tools to find the answer, then call submit with it."
_WORDS = ("river stone cloud maple lantern violet ember harbor quill meadow copper willow "
          "falcon orchard pebble thistle").split()


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 6)))


def make_task(rng: random.Random, kind: str) -> dict[str, Any]:
    if kind == "word_count":
        text = _text(rng)
        question, call, answer = (f"How many words are in the text '{text}'?",
                                  ToolCall("word_count", {"text": text}), len(text.split()))
    elif kind == "char_count":
        text = _text(rng)
        char = rng.choice(sorted(set(text.replace(" ", ""))))
        question, call, answer = (f"How many times does '{char}' occur in '{text}'?",
                                  ToolCall("char_count", {"text": text, "char": char}),
                                  text.count(char))
    elif kind == "reverse_text":
        text = rng.choice(_WORDS)
        question, call, answer = (f"What is '{text}' written backwards?",
                                  ToolCall("reverse_text", {"text": text}), text[::-1])
    elif kind == "divide":
        b = rng.randint(2, 12)
        a = b * rng.randint(2, 40)
        question, call, answer = (f"What is {a} divided by {b}?",
                                  ToolCall("divide", {"a": a, "b": b}), a // b)
    else:
        raise ValueError(f"unknown MCP task kind {kind!r}")
    return {"category": kind, "question": question, "ground_truth": str(answer),
            "oracle_calls": [call.to_dict()]}


def answers_match(given: Any, truth: Any) -> bool:
    a, b = str(given).strip(), str(truth).strip()
    try:
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
    except ValueError:
        return a == b


class MCPEnv(SubmitAnswer):
    """Tool calls served by an MCP server.

    Args:
        url: a streamable-HTTP MCP endpoint (``http://host:port/mcp``); None uses stdio.
        command: the stdio server command (default: the shipped textkit server).
        connect_timeout: seconds to connect and list the tools.
    """

    system_prompt = SYSTEM_PROMPT
    default_max_turns = 6
    KINDS = ("word_count", "char_count", "reverse_text", "divide")

    def __init__(self, *, url: str | None = None, command: list[str] | None = None,
                 connect_timeout: float = 30.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.url = url
        self.command = list(command) if command else [sys.executable, str(SERVER_SCRIPT)]
        self.connect_timeout = connect_timeout
        self._bg = BackgroundLoop("toolrl-mcp")
        self._client: Any = None
        self._remote: list[Tool] = []
        self._stop: asyncio.Event | None = None
        self._holder: concurrent.futures.Future | None = None

    @classmethod
    def make_tasks(cls, n: int, seed: int = 0, split: str = "train",
                   kinds: list[str] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        rng = random.Random(f"mcp:{split}:{seed}")
        kinds = list(kinds or cls.KINDS)
        return [{"id": f"mcp-{split}-{seed}-{i}",
                 **make_task(rng, kinds[i % len(kinds)] if n >= len(kinds) else rng.choice(kinds))}
                for i in range(n)]

    # --- connection ------------------------------------------------------------------------
    def connect(self) -> list[Tool]:
        """Open the MCP session (once) and return the discovered tools."""
        if self._client is not None:
            return self._remote
        from mcp import Client, StdioServerParameters

        target: Any = self.url or StdioServerParameters(command=self.command[0],
                                                        args=self.command[1:])
        ready: concurrent.futures.Future = concurrent.futures.Future()

        async def hold() -> None:
            self._stop = asyncio.Event()
            async with Client(target) as client:
                listed = await client.list_tools()
                ready.set_result((client, listed.tools))
                await self._stop.wait()

        self._holder = self._bg.submit(hold())
        done, _ = concurrent.futures.wait([ready, self._holder], timeout=self.connect_timeout,
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        if ready not in done:
            where = self.url or " ".join(self.command)
            cause = self._holder.exception() if self._holder in done else None
            self.close()
            raise ConnectionError(f"cannot connect to the MCP server at {where}: "
                                  f"{cause or f'no answer within {self.connect_timeout} s'}")
        self._client, listed = ready.result()
        self._remote = [Tool.from_schema({"name": t.name, "description": t.description or "",
                                          "parameters": t.input_schema}, self._remote_fn(t.name))
                        for t in listed]
        return self._remote

    def _remote_fn(self, name: str):
        async def call(**arguments: Any) -> str:
            from mcp.shared.exceptions import MCPError
            from mcp.types import CONNECTION_CLOSED

            try:
                result = await self._bg.run(self._client.call_tool(name, arguments))
            except MCPError as exc:  # the server is gone: infrastructure, not the policy
                if exc.error.code != CONNECTION_CLOSED:
                    raise
                raise ToolFailure("tool_exception", f"MCPError: {exc}", infra=True) from exc
            text = "\n".join(getattr(c, "text", "") for c in result.content)
            if result.is_error:
                raise ToolFailure("tool_exception", text or f"{name} failed")
            return text

        return call

    def close(self) -> None:
        if self._stop is not None and self._bg.started:
            self._bg.call_soon(self._stop.set)
            if self._holder is not None:
                # the session may already have failed; we are closing anyway
                with contextlib.suppress(Exception):
                    self._holder.result(timeout=10)
        self._client, self._stop, self._holder = None, None, None
        self._bg.stop()
        super().close()

    # --- episode ---------------------------------------------------------------------------
    def setup(self, row: dict[str, Any]) -> None:
        if "ground_truth" not in row:
            raise ValueError("an MCP row needs 'ground_truth'")
        self.submitted = None

    def episode_tools(self) -> list[Tool]:
        return [*self.connect(), self.submit]

    submit = submit_tool(str)

    def evaluate(self) -> bool:
        return self.submitted is not None and answers_match(self.submitted,
                                                            self.row["ground_truth"])

    def oracle_action(self) -> str:
        calls = self.row.get("oracle_calls") or []
        if self.turn < len(calls):
            c = calls[self.turn]
            return self.render_calls([ToolCall(c["name"], c["arguments"])])
        return self.render_calls([ToolCall("submit", {"answer": str(self.row["ground_truth"])})])
