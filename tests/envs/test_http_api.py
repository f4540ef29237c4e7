"""toolrl/HttpApi-v0 against the real store service on loopback (started by the fixture)."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest
from toolrl.envs.http_api.env import HttpApiEnv

from toolrl.core.env import run_episode
from toolrl.core.registration import make_env


def call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.fixture
def env(store_url):
    e = make_env("toolrl/HttpApi-v0", base_url=store_url)
    yield e
    e.close()


def test_service_is_a_real_http_server(store_url):
    assert httpx.get(f"{store_url}/health", timeout=5).json() == {"status": "ok"}


def test_scripted_policy_places_the_expected_orders(env):
    for row in HttpApiEnv.make_tasks(6, seed=0):
        ep = asyncio.run(run_episode(env, row=row))
        assert ep.success and ep.final_state == row["expected_state"], row["question"]
        assert not ep.errors


def test_http_errors_timeouts_and_big_responses_are_observations(store_url):
    env = make_env("toolrl/HttpApi-v0", base_url=store_url, max_response_bytes=1000,
                   max_turns=20)
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step(call("get_product", sku="SKU-999"))
    assert not terminated and info["errors"][0]["type"] == "http_error"
    assert "HTTP 404" in json.loads(obs[0]["content"])["message"]
    obs, _, _, _, info = env.step(call("place_order", sku="SKU-101", quantity=10_000))
    assert "HTTP 409" in info["errors"][0]["message"]
    obs, _, _, _, info = env.step(call("place_order", sku="SKU-101", quantity=0))
    assert info["errors"][0]["type"] == "invalid_value"  # schema minimum, never sent
    obs, _, terminated, _, info = env.step(call("export_catalog"))
    assert not terminated and "[response cut at 1000 bytes]" in obs[0]["content"]
    env.close()

    slow = make_env("toolrl/HttpApi-v0", base_url=store_url, latency_ms=3000, tool_timeout=0.3)
    slow.reset(seed=0)
    obs, _, terminated, _, info = slow.step(call("list_orders"))
    assert not terminated and info["errors"][0]["type"] == "timeout"
    slow.close()


def test_connection_errors_are_retried_then_reported():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = make_env("toolrl/HttpApi-v0", base_url=f"http://127.0.0.1:{port}", retries=1)
    env.reset(seed=0)
    _, _, terminated, _, info = env.step(call("list_orders"))
    assert not terminated and info["errors"][0]["type"] == "http_error"
    assert "ConnectError" in info["errors"][0]["message"]
    env.close()


def test_sessions_isolate_concurrent_episodes(store_url):
    """Two episodes buy the same scarce product at once: each sees its own stock."""
    async def both():
        envs = [make_env("toolrl/HttpApi-v0", base_url=store_url) for _ in range(2)]
        for e in envs:
            e.reset(seed=0)
        stock = json.loads((await envs[0].astep(call("get_product", sku="SKU-101")))[0][0]
                           ["content"])["stock"]
        results = await asyncio.gather(*(e.astep(call("place_order", sku="SKU-101",
                                                      quantity=stock)) for e in envs))
        orders = [json.loads((await e.astep(call("list_orders")))[0][0]["content"])["orders"]
                  for e in envs]
        for e in envs:
            await e.unwrapped.aclose()
            e.close()
        return results, orders

    results, orders = asyncio.run(both())
    assert all(not r[4]["errors"] for r in results)
    assert [len(o) for o in orders] == [1, 1] and orders[0][0]["order_id"] == "O-1"


def test_self_hosted_mode_serves_the_app_in_process():
    env = make_env("toolrl/HttpApi-v0")  # no base_url: the shipped app on a loopback thread
    row = HttpApiEnv.make_tasks(1, seed=5)[0]
    ep = asyncio.run(run_episode(env, row=row))
    assert ep.success and env.unwrapped.base_url.startswith("http://127.0.0.1:")
    env.close()
