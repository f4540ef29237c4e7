"""toolrl/MCP-v0: tools discovered from an MCP server with the ``mcp`` SDK.

Over stdio the server is a subprocess (default: the shipped textkit server, ``server.py``; or
any ``command``) in a process group of its own, behind toolrl's watchdog; over streamable HTTP
the env connects to ``url``. By default (``session="shared"``) every env of a process uses
the process's one session (`toolrl.shared_mcp_connection`): a rollout worker starts the server
once and its concurrent episodes share it; ``session="episode"`` opens a session per episode
for stateful servers. Sessions live on a background event loop (`toolrl.MCPConnection`), so
``astep`` works from any loop and the sync ``step`` shim too; connect, call and shutdown
timeouts are exact. Each MCP tool's ``inputSchema`` becomes the tool's parameters (validated
before the call); an ``isError`` result becomes a ``tool_exception`` observation. A local
``submit(answer)`` tool ends the episode.

Tasks ask for a text fact the tools compute; success = the submitted answer equals
``ground_truth`` (numbers compared numerically). Row fields: ``id``, ``category``,
``question``, ``ground_truth``, ``oracle_calls``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

from toolrl import (
    MCPConnection,
    SubmitAnswer,
    Tool,
    ToolCall,
    ToolFailure,
    make_tasks_by_kind,
    shared_mcp_connection,
    submit_tool,
)

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
        session: ``"shared"`` (default): one session per process, shared by every episode of
            it (a rollout worker starts one server, not one per episode); for servers that keep
            no per-client state. ``"episode"``: a session of its own per episode (over stdio a
            server process per episode, over HTTP a new MCP session on the same server); for
            stateful servers.
        connect_timeout: seconds to start the server, connect and list the tools (exact).
        shutdown_timeout: seconds a closing session waits for the server to end before its
            process group is killed.
    """

    system_prompt = SYSTEM_PROMPT
    default_max_turns = 6
    KINDS = ("word_count", "char_count", "reverse_text", "divide")
    SESSIONS = ("shared", "episode")

    def __init__(self, *, url: str | None = None, command: list[str] | None = None,
                 session: str = "shared", connect_timeout: float = 30.0,
                 shutdown_timeout: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if session not in self.SESSIONS:
            raise ValueError(f"session must be one of {list(self.SESSIONS)}, got {session!r}")
        self.url = url
        self.command = list(command) if command else [sys.executable, str(SERVER_SCRIPT)]
        self.session = session
        self.connect_timeout = connect_timeout
        self.shutdown_timeout = shutdown_timeout
        self._conn: MCPConnection | None = None
        self._remote: list[Tool] = []

    make_tasks = make_tasks_by_kind(make_task, name="mcp", prefix="mcp")

    # --- connection ------------------------------------------------------------------------
    @property
    def target(self) -> str | list[str]:
        return self.url or self.command

    def connect(self) -> list[Tool]:
        """This episode's session (the process's shared one, or a new one) and its tools."""
        if self.session == "shared":
            conn = shared_mcp_connection(self.target, connect_timeout=self.connect_timeout,
                                         shutdown_timeout=self.shutdown_timeout)
        else:
            self._close_own()
            conn = MCPConnection(self.target, connect_timeout=self.connect_timeout,
                                 shutdown_timeout=self.shutdown_timeout)
            conn.open()  # a failed open ends its half-open session in the background
        if conn is not self._conn:
            self._conn = conn
            self._remote = [Tool.from_schema({"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema},
                                             self._remote_fn(conn, t.name))
                            for t in conn.tools]
        return self._remote

    @staticmethod
    def _remote_fn(conn: MCPConnection, name: str):
        async def call(**arguments: Any) -> str:
            from mcp.shared.exceptions import MCPError
            from mcp.types import CONNECTION_CLOSED

            try:
                result = await conn.call_tool(name, arguments)
            except MCPError as exc:  # the server is gone: infrastructure, not the policy
                if exc.error.code != CONNECTION_CLOSED:
                    raise
                raise ToolFailure("tool_exception", f"MCPError: {exc}", infra=True) from exc
            text = "\n".join(getattr(c, "text", "") for c in result.content)
            if result.is_error:
                raise ToolFailure("tool_exception", text or f"{name} failed")
            return text

        return call

    def _close_own(self) -> None:
        conn, self._conn, self._remote = self._conn, None, []
        if conn is not None and self.session == "episode":
            conn.close()

    def close(self) -> None:
        """Ends an ``"episode"`` session (its server's process group is gone on return); a
        shared session stays with the process (`toolrl.close_mcp_connections`)."""
        self._close_own()
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
