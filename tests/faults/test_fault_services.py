"""Fault table, remote tools: the HTTP tool service goes down mid-episode, hangs (accepts the
connection, never answers), answers 500 or answers bytes that are neither UTF-8 nor JSON; the
MCP server crashes in the middle of a call or is killed between turns.

Expected: typed error observations (``http_error``, ``timeout``, ``tool_exception``), no hang,
the episodes still run to their end (the outcome check fails cleanly instead of raising), and
every episode that went in comes out once.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import uuid
from pathlib import Path

import psutil
import pytest
from fault_harness import assert_conserved, call, play_batch, serve_asgi, server_process

from toolrl.core.mcp_client import close_mcp_connections
from toolrl.core.registration import make_env

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def no_shared_mcp_sessions():
    """Shared MCP sessions (and their servers) end with each test."""
    yield
    close_mcp_connections()
HTTP_ENV, MCP_ENV = "toolrl/HttpApi-v0", "toolrl/MCP-v0"
FAULT_SERVER = str(Path(__file__).with_name("mcp_fault_server.py"))


def http_rows(prefix: str, n: int = 4) -> list[dict]:
    from toolrl.envs.http_api.env import HttpApiEnv

    return [dict(r, id=f"{prefix}-{i}") for i, r in enumerate(HttpApiEnv.make_tasks(n, seed=3))]


def kinds(ep) -> list[list[str]]:
    return [[e["type"] for e in t.errors] for t in ep.turns]


def tool_outputs(ep) -> list[str]:
    return [m["content"] for m in ep.messages if m["role"] == "tool"]


# --- HTTP ----------------------------------------------------------------------------------
def test_http_service_down_mid_episode():
    """The service serves turn 1, then stops; turn 2 fails to connect (after retries)."""
    from toolrl.envs.http_api.service import ThreadedServer

    server = ThreadedServer().start()
    rows = http_rows("down")

    async def phases():
        envs = {r["id"]: make_env(HTTP_ENV, base_url=server.url, retries=1) for r in rows}
        try:
            for r in rows:
                envs[r["id"]].reset(options=r)
            first = await asyncio.gather(*(envs[r["id"]].astep(call("list_orders"))
                                           for r in rows))
            await asyncio.to_thread(server.stop)
            second = await asyncio.gather(*(envs[r["id"]].astep(call("list_orders"))
                                            for r in rows))
            last = await asyncio.gather(*(envs[r["id"]].astep("Done.") for r in rows))
        finally:
            for env in envs.values():
                await env.unwrapped.aclose()
                env.close()
        return first, second, last

    try:
        first, second, last = asyncio.run(asyncio.wait_for(phases(), 60))
    finally:
        server.stop()
    assert all(json.loads(obs[0]["content"]) == {"orders": []} and not info["errors"]
               for obs, _, _, _, info in first)
    for _, _, terminated, _, info in second:
        assert [e["type"] for e in info["errors"]] == ["http_error"] and not terminated
        assert "ConnectError" in info["errors"][0]["message"]
    assert_conserved([r["id"] for r in rows], [r["id"] for r, out in zip(rows, last,
                                                                         strict=True) if out[2]])
    assert all(info["success"] is False for _, _, _, _, info in last)


@pytest.fixture
def black_hole():
    """A TCP server that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def test_http_service_that_never_answers_times_out(black_hole):
    rows = http_rows("hang")
    episodes = asyncio.run(play_batch(
        lambda: make_env(HTTP_ENV, base_url=black_hole, tool_timeout=0.4), rows, timeout=60))
    for ep in episodes.values():
        assert kinds(ep) == [["timeout"], ["timeout"], []]
        assert ep.finish_reason == "terminated" and not ep.success
        assert ep.final_state == {"orders": None}


async def faulty_store(scope, receive, send):
    """Every request: 500, except ``/products`` which answers 200 with bytes that are neither
    UTF-8 nor JSON."""
    if scope["type"] != "http":
        return
    garbage = scope["path"] == "/products"
    body = b"\xff\xfe<html>\x80 not json" if garbage else b'{"detail": "boom"}'
    await send({"type": "http.response.start", "status": 200 if garbage else 500,
                "headers": [(b"content-type", b"application/octet-stream")]})
    await send({"type": "http.response.body", "body": body})


def test_http_service_answering_500_or_garbage():
    rows = http_rows("err")
    with serve_asgi(faulty_store) as url:
        episodes = asyncio.run(play_batch(lambda: make_env(HTTP_ENV, base_url=url), rows,
                                          timeout=60))
    for ep in episodes.values():
        assert kinds(ep) == [[], ["http_error"], []]
        garbage, error = tool_outputs(ep)
        assert "\ufffd" in garbage and garbage.endswith("not json")  # as valid text
        assert json.loads(error)["message"].startswith("HTTP 500")
        assert ep.finish_reason == "terminated" and not ep.success
        assert ep.final_state == {"orders": None}


# --- MCP -----------------------------------------------------------------------------------
MCP_ROW = {"question": "Echo, then submit x.", "ground_truth": "x"}


def mcp_policy(script):
    def policy(env, messages):
        return script[env.unwrapped.turn]

    return policy


def test_mcp_server_crashes_mid_call():
    """``crash`` kills the stdio server while the call is in flight; later remote calls fail
    fast; the local ``submit`` still ends the episode. Each episode has its own server here
    (``session="episode"``); a crash of a shared one: test_fault_tool_servers.py."""
    rows = [dict(MCP_ROW, id=f"mcp-crash-{i}") for i in range(2)]
    script = [call("echo", text="hi"), call("crash"), call("echo", text="again"),
              call("submit", answer="x")]
    episodes = asyncio.run(play_batch(
        lambda: make_env(MCP_ENV, command=[sys.executable, FAULT_SERVER], tool_timeout=20,
                         session="episode"),
        rows, mcp_policy(script), timeout=90))
    for ep in episodes.values():
        assert kinds(ep) == [[], ["tool_exception"], ["tool_exception"], []]
        outputs = tool_outputs(ep)
        assert outputs[0] == "hi" and "Connection closed" in outputs[1]
        assert ep.finish_reason == "terminated" and ep.success


def test_mcp_server_killed_between_turns():
    tag = uuid.uuid4().hex
    killed: list[int] = []

    def policy(env, messages):
        if env.unwrapped.turn == 1:
            for proc in psutil.Process().children(recursive=True):
                try:  # a process that just ended (a zombie) has no command line
                    if tag in " ".join(proc.cmdline()):
                        proc.kill()
                        killed.append(proc.pid)
                except psutil.Error:
                    continue
        return [call("echo", text="hi"), call("echo", text="after"),
                call("submit", answer="x")][env.unwrapped.turn]

    rows = [dict(MCP_ROW, id="mcp-killed")]
    episodes = asyncio.run(play_batch(
        lambda: make_env(MCP_ENV, command=[sys.executable, FAULT_SERVER, "--tag", tag],
                         tool_timeout=20), rows, policy, timeout=90))
    ep = episodes["mcp-killed"]
    assert killed and kinds(ep) == [[], ["tool_exception"], []]
    assert ep.finish_reason == "terminated" and ep.success


def test_mcp_http_server_crashes_mid_call():
    """The same over streamable HTTP (one episode: the crash ends the shared server)."""
    rows = [dict(MCP_ROW, id="mcp-http")]
    script = [call("echo", text="hi"), call("crash"), call("echo", text="again"),
              call("submit", answer="x")]
    with server_process([FAULT_SERVER, "--transport", "http", "--port", "0"]) as (proc, url):
        episodes = asyncio.run(play_batch(
            lambda: make_env(MCP_ENV, url=url, tool_timeout=20), rows, mcp_policy(script),
            timeout=90))
        assert proc.wait(timeout=10) == 17  # the server really died mid-call
    ep = episodes["mcp-http"]
    assert kinds(ep) == [[], ["tool_exception"], ["tool_exception"], []]
    assert ep.finish_reason == "terminated" and ep.success
