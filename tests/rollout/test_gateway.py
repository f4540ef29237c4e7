"""The OpenAI-compatible gateway on a real tiny vLLM engine, driven by the official client.

One engine per module; the gateway is served by uvicorn on loopback. The tiny model has
random weights, so replies with tool calls come from ``tool_choice`` required / named
(constrained decoding in the hermes syntax) or from a test format that reads every message as
a call.
"""

from __future__ import annotations

import json

import httpx
import openai
import psutil
import pytest

from toolrl.core.parse import FORMATS, ToolCallFormat
from toolrl.core.types import ParseResult, ToolCall
from toolrl.rollout.chat import ChatRenderer
from toolrl.rollout.engine import EngineConfig, VLLMEngine
from toolrl.rollout.gateway.app import Gateway
from toolrl.rollout.gateway.server import GatewayServer

pytestmark = pytest.mark.slow

MODEL = "tiny-policy"
# bounded, so that a random model's constrained digits end within the token budget
SMALL_INT = {"type": "integer", "minimum": 0, "maximum": 99}
TOOLS = [
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object",
                       "properties": {"a": SMALL_INT, "b": SMALL_INT},
                       "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Submit the answer.",
        "parameters": {"type": "object", "properties": {"answer": SMALL_INT},
                       "required": ["answer"], "additionalProperties": False}}},
]
MESSAGES = [{"role": "system", "content": "Use the tools."},
            {"role": "user", "content": "What is 2 plus 3?"}]


@FORMATS.register("test-every-message-calls-submit")
class EveryMessageCallsSubmit(ToolCallFormat):
    """Reads every assistant message as ``submit(answer=1)`` (so a random model calls)."""

    name = "test-every-message-calls-submit"

    def _parse(self, text: str) -> ParseResult:
        return ParseResult(calls=[ToolCall("submit", {"answer": 1})], text="")


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    eng = VLLMEngine(EngineConfig(model=str(tiny_model_dir), max_model_len=1024,
                                  kv_cache_gib=0.25, multiprocessing=False))
    yield eng
    eng.shutdown()
    leftover = [p for p in psutil.Process().children(recursive=True) if p.pid not in before
                and "resource_tracker" not in " ".join(p.cmdline())]
    assert not leftover, f"engine processes left running: {leftover}"


@pytest.fixture(scope="module")
def gateway(engine):
    return Gateway(engine, ChatRenderer(engine.tokenizer), model=MODEL, max_tokens=48)


@pytest.fixture(scope="module")
def server(gateway):
    with GatewayServer(gateway) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()


def test_models_lists_the_served_model(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    r = httpx.get(f"{server.url}/episodes/nope/v1/models")
    assert r.status_code == 404 and r.json()["error"]["code"] == "episode_not_found"


def test_text_reply_with_usage_and_max_tokens(client):
    for key in ("max_tokens", "max_completion_tokens"):
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0,
                                           **{key: 5})
        choice = r.choices[0]
        assert r.object == "chat.completion" and r.model == MODEL
        assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
        assert choice.message.tool_calls is None
        assert choice.finish_reason in ("stop", "length")
        assert 1 <= r.usage.completion_tokens <= 5
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_seeded_sampling_repeats_and_log_probs_come_back(client):
    def ask(seed):
        return client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=1.0,
                                              top_p=0.95, seed=seed, max_tokens=16,
                                              logprobs=True)

    a, b, c = ask(1), ask(1), ask(2)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].message.content != c.choices[0].message.content
    lps = a.choices[0].logprobs.content
    assert len(lps) == a.usage.completion_tokens
    assert all(x.logprob <= 0 for x in lps)
    assert [x.logprob for x in lps] == [x.logprob for x in b.choices[0].logprobs.content]


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "submit"}}])
def test_required_and_named_tool_choice_give_a_valid_call(client, choice):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                       tool_choice=choice, temperature=1.0, seed=3,
                                       max_tokens=60)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c.message
    [call] = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    if isinstance(choice, dict):
        assert call.function.name == "submit" and set(args) == {"answer"}
    else:
        assert call.function.name in ("add", "submit")


def test_auto_parses_calls_with_the_configured_format_and_none_does_not(engine):
    gw = Gateway(engine, ChatRenderer(engine.tokenizer), model=MODEL,
                 format="test-every-message-calls-submit", max_tokens=8)
    with GatewayServer(gw) as srv, openai.OpenAI(base_url=srv.base_url, api_key="x",
                                                 max_retries=0, timeout=60) as cl:
        auto = cl.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                          temperature=0)
        none = cl.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                          tool_choice="none", temperature=0)
    assert auto.choices[0].finish_reason == "tool_calls"
    [call] = auto.choices[0].message.tool_calls
    assert call.function.name == "submit" and json.loads(call.function.arguments) == \
        {"answer": 1}
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].finish_reason in ("stop", "length")
    assert isinstance(none.choices[0].message.content, str)


def test_streaming_matches_the_plain_reply(client):
    kw = {"model": MODEL, "messages": MESSAGES, "temperature": 1.0, "seed": 7,
          "max_tokens": 12}
    plain = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True,
                                                 stream_options={"include_usage": True}, **kw))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == plain.choices[0].finish_reason and finishes.count(None) == \
        len(finishes) - 1
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    call = list(client.chat.completions.create(
        stream=True, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
        **{**kw, "max_tokens": 60}))
    deltas = [d for ch in call for d in (ch.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in deltas] == ["add"]
    assert set(json.loads(deltas[0].function.arguments)) == {"a", "b"}
    assert call[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(("changes", "status", "param"), [
    ({"n": 2}, 400, "n"),
    ({"model": "gpt-4o"}, 404, "model"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "tool", "content": "5"}]}, 400, "messages[0].tool_call_id"),
    ({"temperature": 3}, 400, "temperature"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"tool_choice": {"type": "function", "function": {"name": "mul"}}, "tools": TOOLS}, 400,
     "tool_choice"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"frobnicate": True}, 400, "frobnicate"),
])
def test_bad_requests_get_openai_shaped_errors(server, changes, status, param):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **changes}
    r = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and "type" in err


def test_the_official_client_raises_its_own_error_classes(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2)
    assert "n=2" in e.value.message
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="other", messages=MESSAGES)
    assert e.value.code == "model_not_found"


def test_malformed_json_and_unknown_paths(server):
    r = httpx.post(f"{server.base_url}/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.get(f"{server.url}/v1/nothing-here", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_a_prompt_past_the_context_window_is_a_400(client):
    long = [{"role": "user", "content": "1 " * 2000}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=long, max_tokens=4)
    assert e.value.code == "context_length_exceeded"
