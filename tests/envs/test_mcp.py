"""toolrl/MCP-v0 against the shipped MCP server: stdio subprocess and streamable HTTP."""

from __future__ import annotations

import asyncio
import json

import pytest
from toolrl.envs.mcp.env import MCPEnv

from toolrl.core.env import run_episode
from toolrl.core.mcp_client import close_mcp_connections
from toolrl.core.registration import make_env


def call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.fixture(scope="module")
def stdio_env():
    env = make_env("toolrl/MCP-v0")  # spawns the server over stdio on first reset
    yield env
    env.close()
    close_mcp_connections()  # the process's shared session and its server


def test_tools_are_discovered_with_their_input_schemas(stdio_env):
    _, info = stdio_env.reset(seed=0)
    tools = {t["function"]["name"]: t["function"] for t in info["tools"]}
    assert set(tools) == {"word_count", "char_count", "reverse_text", "divide", "submit"}
    params = tools["char_count"]["parameters"]
    assert params["required"] == ["text", "char"]
    assert params["properties"]["text"]["type"] == "string"
    assert tools["divide"]["parameters"]["properties"]["b"]["type"] == "number"


def test_scripted_policy_over_stdio(stdio_env):
    for row in MCPEnv.make_tasks(8, seed=0):
        ep = asyncio.run(run_episode(stdio_env, row=row))
        assert ep.success and not ep.errors, row["question"]


def test_server_errors_and_schema_violations(stdio_env):
    stdio_env.reset(seed=1)
    obs, _, terminated, _, info = stdio_env.step(
        call("divide", a=1, b=0) + call("divide", a="x", b=1) + call("char_count", text="a",
                                                                       char="ab"))
    assert not terminated
    assert [e["type"] for e in info["errors"]] == ["tool_exception", "wrong_type",
                                                   "tool_exception"]
    assert "ZeroDivisionError" in obs[0]["content"] and "ValueError" in obs[2]["content"]
    obs, *_ = stdio_env.step(call("reverse_text", text="abc"))
    assert obs[0]["content"] == "cba"  # the session survived the errors


def test_concurrent_calls_from_another_event_loop(stdio_env):
    stdio_env.reset(seed=2)

    async def turn():
        return await stdio_env.astep(call("word_count", text="a b c") +
                                     call("reverse_text", text="xy") +
                                     call("divide", a=9, b=3))

    obs, *_ = asyncio.run(turn())
    assert [m["content"] for m in obs] == ["3", "yx", "3.0"]


def test_streamable_http_transport(mcp_http_url):
    env = make_env("toolrl/MCP-v0", url=mcp_http_url)
    try:
        for row in MCPEnv.make_tasks(4, seed=3):
            ep = asyncio.run(run_episode(env, row=row))
            assert ep.success, row["question"]
    finally:
        env.close()


def test_unreachable_server_fails_loudly():
    env = make_env("toolrl/MCP-v0", command=["/nonexistent/mcp-server"], connect_timeout=20)
    with pytest.raises(ConnectionError, match="cannot connect to the MCP server"):
        env.reset(seed=0)
    env.close()
    close_mcp_connections()


def test_session_must_be_shared_or_episode():
    with pytest.raises(ValueError, match=r"session must be one of \['shared', 'episode'\]"):
        make_env("toolrl/MCP-v0", session="worker")
