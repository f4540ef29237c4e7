"""The OpenAI-compatible gateway on a real tiny vLLM engine, driven by the official client.

One engine per module; the gateway is served by uvicorn on loopback. The tiny model has
random weights, so replies with tool calls come from ``tool_choice`` required / named
(constrained decoding in the hermes syntax) or from a test format that reads every message as
a call.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.parse

import httpx
import openai
import pytest
import torch
from engine_checks import child_pids, left_running
from transformers import AutoModelForCausalLM

from toolrl.core.env import ToolEnv, Turn
from toolrl.core.parse import FORMATS, ToolCallFormat, get_format
from toolrl.core.registration import make_env, register_env
from toolrl.core.tools import tool
from toolrl.core.types import ParseResult, ToolCall
from toolrl.rollout.chat import ChatRenderer
from toolrl.rollout.engine import EngineConfig, SamplingConfig, VLLMEngine
from toolrl.rollout.episode import EpisodeConfig, EpisodeRunner
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


class EveryMessageCallsNote(ToolCallFormat):
    """Reads every assistant message as one call of ``note`` (so a random model uses tools)."""

    name = "test-every-message-calls-note"

    def _parse(self, text: str) -> ParseResult:
        return ParseResult(calls=[ToolCall("note", {})], text=text)


class ThreeTurnEnv(ToolEnv):
    """Every turn calls ``note``; the episode ends after three turns."""

    def __init__(self, **kwargs):
        super().__init__(max_turns=4, **kwargs)
        self.parser = EveryMessageCallsNote()

    @classmethod
    def make_tasks(cls, n, seed=0, split="train", **kwargs):
        return [{"id": f"three-{seed}-{i}", "question": "Take three notes."} for i in range(n)]

    @tool
    def note(self) -> str:
        """Take a note."""
        return "noted"

    def on_turn(self, parse, results):
        return Turn(terminated=self.turn >= 3)

    def evaluate(self):
        return True


register_env("toolrl-test/ThreeTurn-v0", ThreeTurnEnv)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    before = child_pids()
    eng = VLLMEngine(EngineConfig(model=str(tiny_model_dir), max_model_len=1024,
                                  kv_cache_gib=0.25, multiprocessing=False))
    yield eng
    eng.shutdown()
    leftover = left_running(before)
    assert not leftover, f"engine processes left running: {leftover}"


@pytest.fixture(scope="module")
def gateway(engine):
    # a grammar-constrained call of TOOLS is at most ~70 characters, so at most ~70 tokens of
    # the tiny tokenizer: a cap above that lets every constrained call finish, whatever the
    # random model's draws (48 cut some off, depending on the tests run before)
    return Gateway(engine, ChatRenderer(engine.tokenizer), model=MODEL, max_tokens=80)


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
                                       max_tokens=80)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c.message
    [call] = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    if isinstance(choice, dict):
        assert call.function.name == "submit" and set(args) == {"answer"}
    else:
        assert call.function.name in ("add", "submit")


def test_a_grammar_constrained_call_is_counted_on_its_episode(gateway, server):
    """``tool_choice: required`` samples through a grammar: the capture says so, and so do the
    trajectory and ``rollout/gateway_constrained_calls`` (the trainer warns on it without a
    correction)."""
    from toolrl.rollout.gateway.agent import episode_rows, gateway_metrics

    eid = gateway.open_episode()
    with openai.OpenAI(base_url=server.episode_url(eid), api_key="x", max_retries=0,
                       timeout=60) as cl:
        for choice in ("auto", "required"):
            cl.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                       tool_choice=choice, temperature=1.0, seed=5,
                                       max_tokens=40)
    capture = gateway.close_episode(eid)
    assert [c.constrained for c in capture.calls] == [False, True]
    assert all(len(c.versions) == len(c.completion_ids) for c in capture.calls)
    traj, samples = capture.trajectory({}, format="hermes")
    assert traj.extra["gateway"]["constrained"] == 1
    _, _, rows = episode_rows([{}], ["u"], [(traj, samples)])  # the batch's rows
    assert gateway_metrics(rows)["rollout/gateway_constrained_calls"] == 1.0


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
        **{**kw, "max_tokens": 80}))
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
    ({"top_logprobs": 3, "logprobs": True}, 400, "top_logprobs"),
    ({"parallel_tool_calls": False, "tools": TOOLS}, 400, "parallel_tool_calls"),
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


def _same_answer(r: httpx.Response) -> tuple[int, str, object]:
    """Status, media type and body, fresh ids and timestamps left out."""
    volatile = {"id", "created", "created_at", "request_id", "system_fingerprint"}

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in volatile}
        return [strip(x) for x in v] if isinstance(v, list) else v

    media = r.headers["content-type"].split(";")[0]
    if media == "text/event-stream":
        body = [strip(json.loads(line[6:])) if line.startswith("data: {") else line
                for line in r.text.splitlines() if line]
    else:
        body = strip(r.json())
    return r.status_code, media, body


def test_the_in_process_transport_answers_as_the_served_app(engine, gateway, server):
    """`Gateway.transport` skips the ASGI round trip: every route, status, error shape and
    reply (streamed too) is the one the app serves over HTTP."""
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "temperature": 0.0}
    requests = [
        ("GET", "/v1/models", None), ("HEAD", "/v1/models", None),
        ("GET", "/episodes/nope/v1/models", None), ("HEAD", "/v1/responses", None),
        ("GET", "/v1/nothing-here", None), ("GET", "/v1/chat/completions", None),
        ("POST", "/v1/models", b"{}"), ("POST", "/v1/chat/completions", b"{not json"),
        ("POST", "/v1/chat/completions", json.dumps({**chat, "model": "other"}).encode()),
        ("POST", "/v1/messages", b"{}"), ("POST", "/v1/responses", b"{}"),
        ("POST", "/episodes/nope/v1/chat/completions", json.dumps(chat).encode()),
        ("POST", "/v1/chat/completions", json.dumps(chat).encode()),
        ("POST", "/v1/chat/completions", json.dumps({**chat, "stream": True}).encode()),
        ("POST", "/v1/messages", json.dumps({"model": MODEL, "max_tokens": 8,
                                             "temperature": 0.0, "stream": True, "messages": [
                                                 {"role": "user", "content": "Hi"}]}).encode()),
    ]

    async def in_process():
        async with httpx.AsyncClient(transport=gateway.transport(httpx),
                                     base_url="http://gateway") as c:
            return [await c.request(m, path, content=body) for m, path, body in requests]

    inside = engine.run_on_loop(in_process())
    with httpx.Client(base_url=server.url, timeout=60) as c:
        served = [c.request(m, path, content=body) for m, path, body in requests]
    statuses = [r.status_code for r in served]
    assert statuses == [200, 200, 404, 405, 404, 405, 405, 400, 404, 400, 400, 404, 200, 200,
                        200]
    for (m, path, _), a, b in zip(requests, inside, served, strict=True):
        if m == "HEAD":  # the status and headers a GET would get, never a body
            assert (a.status_code, a.content, b.content) == (b.status_code, b"", b""), path
            assert a.headers["content-type"] == b.headers["content-type"], path
            continue
        assert _same_answer(a) == _same_answer(b), f"{m} {path}"


def test_an_idle_connection_stays_open_past_uvicorns_default_keep_alive(server):
    """An agent whose tool runs ~5 s sends its next call on its kept-alive connection: a server
    that closes idle connections after uvicorn's default 5 s failed such calls (a race)."""
    u = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        for pause in (5.5, 0.0):
            conn.request("GET", "/v1/models")
            r = conn.getresponse()
            assert r.status == 200 and r.read()
            time.sleep(pause)
    finally:
        conn.close()


def test_a_prompt_past_the_context_window_is_a_400(client):
    long = [{"role": "user", "content": "1 " * 2000}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=long, max_tokens=4)
    assert e.value.code == "context_length_exceeded"


# --- token capture per episode ----------------------------------------------------------------
def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def _action_text(message) -> str:
    """The text the model wrote, from the gateway's reply (calls rendered back in hermes)."""
    if not message.tool_calls:
        return message.content or ""
    calls = [ToolCall(c.function.name, json.loads(c.function.arguments))
             for c in message.tool_calls]
    return get_format("hermes").render(calls, message.content or "")


async def _replay_env_loop(base_url: str, row: dict, turns: int, max_tokens: int) -> None:
    """An agent that plays ThreeTurn-v0 through the OpenAI client, greedily, as the env path
    would: the env gets the text the model wrote and its observations go back as messages."""
    env = make_env("toolrl-test/ThreeTurn-v0")
    messages, info = env.reset(options=row)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as cl:
        for _ in range(turns):
            r = await cl.chat.completions.create(model=MODEL, messages=messages,
                                                 tools=info["tools"], temperature=0,
                                                 max_tokens=max_tokens)
            msg = r.choices[0].message
            obs, _, terminated, truncated, _ = env.step(_action_text(msg))
            messages = [*messages, msg.model_dump(exclude_none=True),
                        *({"tool_call_id": "call_0", **o} for o in obs)]
            if terminated or truncated:
                break
    env.close()


def test_a_three_turn_agent_episode_equals_the_env_path(engine, gateway, server):
    row = ThreeTurnEnv.make_tasks(1)[0]
    per_turn = 12
    runner = EpisodeRunner(engine, gateway.renderer, EpisodeConfig(
        sampling=SamplingConfig(temperature=0.0, max_tokens=per_turn), max_turns=3,
        max_prompt_len=512, max_response_len=480))
    env = make_env("toolrl-test/ThreeTurn-v0")
    ref = _run(runner.run(env, row, seed=0))
    env.close()
    assert ref.num_turns == 3 and ref.finish_reason == "terminated"
    eid = gateway.open_episode()
    _run(_replay_env_loop(server.episode_url(eid), row, 3, per_turn))
    capture = gateway.close_episode(eid)
    traj, samples = capture.trajectory(row, format="hermes")
    assert len(capture.calls) == 3 and capture.splits == 0 and len(samples) == 1
    got, want = samples[0].tokens, ref.tokens
    end = len(want.response_ids)
    assert got.prompt_ids == want.prompt_ids
    assert got.response_ids == want.response_ids[:end]
    assert got.response_mask == want.response_mask[:end]
    assert got.log_probs == pytest.approx(want.log_probs[:end], abs=1e-6)
    assert got.versions == want.versions[:end]  # the engine's version on every sampled token
    assert {v for v, m in zip(got.versions, got.response_mask, strict=True) if m} == \
        {engine.weight_version}
    assert [t.action_span for t in traj.turns] == [t.action_span for t in ref.turns]
    assert [t.action for t in traj.turns] == [t.action for t in ref.turns]
    assert traj.extra["gateway"]["splits"] == 0 and traj.sampled_tokens == sum(got.response_mask)


def test_a_rewritten_history_starts_a_second_sample(gateway, server, hf_model):
    async def agent(base_url):
        async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as cl:
            first = await cl.chat.completions.create(model=MODEL, messages=MESSAGES,
                                                     temperature=1.0, seed=11, max_tokens=10)
            keep = [*MESSAGES, first.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": "Go on."}]
            await cl.chat.completions.create(model=MODEL, messages=keep, temperature=1.0,
                                             seed=12, max_tokens=10)
            summary = [MESSAGES[0], {"role": "user", "content": "Summary so far: 2 + 3."}]
            await cl.chat.completions.create(model=MODEL, messages=summary, temperature=1.0,
                                             seed=13, max_tokens=10)

    eid = gateway.open_episode()
    _run(agent(server.episode_url(eid)))
    capture = gateway.close_episode(eid)
    traj, samples = capture.trajectory({"id": "t"}, format="hermes")
    assert [c.extends for c in capture.calls] == [False, True, False]
    assert capture.splits == 1 and len(samples) == 2
    assert traj.extra["gateway"]["turn_sample"] == [0, 0, 1]
    a, b = samples[0].tokens, samples[1].tokens
    assert a.prompt_ids == capture.calls[0].prompt_ids
    assert b.prompt_ids == capture.calls[2].prompt_ids
    n0, n1 = (len(c.completion_ids) for c in capture.calls[:2])
    assert a.response_mask[:n0] == [1] * n0 and a.response_mask[-n1:] == [1] * n1
    assert set(a.response_mask[n0:-n1]) == {0}  # the closing, the user turn, the prompt
    for s in samples:
        assert_engine_log_probs_match_hf(hf_model, s.tokens)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def assert_engine_log_probs_match_hf(hf, s) -> None:
    """transformers' fp32 log-probs of the sampled tokens equal the engine's."""
    ids = torch.tensor([s.prompt_ids + s.response_ids])
    with torch.no_grad():
        logits = hf(ids).logits[0].float()
    p = len(s.prompt_ids)
    logp = torch.log_softmax(logits[p - 1: -1], -1)
    ref = logp.gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]
    mask = torch.tensor(s.response_mask).bool()
    assert mask.any()
    got = torch.tensor(s.log_probs)
    assert torch.allclose(got[mask], ref[mask], atol=1e-4), (got[mask] - ref[mask]).abs().max()
    assert (got[~mask] == 0).all()


def test_the_prompt_budget_bounds_a_samples_first_prompt_only(engine):
    """A call that extends the sample may pass max_prompt_tokens (its growth is response);
    once the response budget is spent, the next call starts afresh: here its prompt does not
    fit, an OpenAI 400 ``context_length_exceeded``."""
    renderer = ChatRenderer(engine.tokenizer)
    first = len(renderer.render_prompt(MESSAGES))
    gw = Gateway(engine, renderer, model=MODEL, max_tokens=8, max_prompt_tokens=first + 2,
                 max_response_tokens=40)
    eid = gw.open_episode()

    async def agent(base_url):
        async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as cl:
            messages = list(MESSAGES)
            for _ in range(8):
                r = await cl.chat.completions.create(model=MODEL, messages=messages,
                                                     temperature=0)
                messages += [r.choices[0].message.model_dump(exclude_none=True),
                             {"role": "user", "content": "go"}]

    with GatewayServer(gw) as srv, pytest.raises(openai.BadRequestError) as e:
        _run(agent(srv.episode_url(eid)))
    assert e.value.code == "context_length_exceeded"  # the whole history, rendered afresh
    capture = gw.close_episode(eid)
    assert capture.overflow and capture.splits == 0
    assert capture.calls[1].extends and len(capture.calls[1].prompt_ids) > first + 2
    [sample] = capture.samples()
    assert len(sample.tokens.response_ids) <= 40


# --- one capture for three APIs -----------------------------------------------------------------
CALC_SCRIPT = [  # what the scripted policy's k-th message calls
    [ToolCall("add", {"a": 16, "b": 9}), ToolCall("mul", {"a": 2, "b": 3})],  # parallel calls
    [ToolCall("div", {"a": 1, "b": 0})],  # a tool error
    [ToolCall("submit", {"answer": 25})],  # the final answer
]


class ScriptedCalculator(ToolCallFormat):
    """Reads the k-th message it parses as the calls of ``CALC_SCRIPT[k]``: a random model
    then plays a 3-turn Calculator episode (one instance per episode, for the env loop's env
    and for the gateway alike)."""

    name = "test-scripted-calculator"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.k = 0

    def _parse(self, text: str) -> ParseResult:
        calls = CALC_SCRIPT[min(self.k, len(CALC_SCRIPT) - 1)]
        self.k += 1
        return ParseResult(calls=[ToolCall(c.name, dict(c.arguments)) for c in calls], text="")


def _calculator():
    from toolrl.envs.calculator import CalculatorEnv

    env = make_env("toolrl/Calculator-v0")
    env.unwrapped.parser = ScriptedCalculator()
    return env, CalculatorEnv.make_tasks(1, seed=0, difficulty=1, style="plain")[0]


class ChatDriver:
    """A Calculator tool loop through Chat Completions (the official client)."""

    def __init__(self, cl, system, question, tools, stream):
        self.cl, self.tools, self.stream = cl, tools, stream
        self.messages = [{"role": "system", "content": system},
                         {"role": "user", "content": question}]

    async def ask(self, max_tokens):
        kw = {"model": MODEL, "messages": self.messages, "tools": self.tools, "temperature": 0,
              "max_tokens": max_tokens}
        if self.stream:
            async with self.cl.chat.completions.stream(**kw) as s:
                msg = (await s.get_final_completion()).choices[0].message
        else:
            msg = (await self.cl.chat.completions.create(**kw)).choices[0].message
        self.messages.append(msg.model_dump(exclude_none=True, exclude={"parsed"}))
        return [c.id for c in msg.tool_calls or ()]

    def answer(self, ids, observations):
        self.messages += [{"role": "tool", "tool_call_id": i, "name": o["name"],
                           "content": o["content"]} for i, o in zip(ids, observations,
                                                                    strict=True)]


class ResponsesDriver:
    """The same loop through the Responses API: the whole input each time, or (``chained``)
    only the new items after ``previous_response_id``."""

    def __init__(self, cl, system, question, tools, stream, chained=False):
        self.cl, self.stream, self.chained, self.system = cl, stream, chained, system
        self.tools = [{"type": "function", "strict": False, **t["function"]} for t in tools]
        self.items = [{"role": "user", "content": question}]
        self.new, self.last = list(self.items), None

    async def ask(self, max_tokens):
        kw = {"model": MODEL, "instructions": self.system, "tools": self.tools,
              "temperature": 0, "max_output_tokens": max_tokens,
              "input": self.new if self.chained else self.items}
        if self.chained and self.last is not None:
            kw["previous_response_id"] = self.last
        if self.stream:
            events = [e async for e in await self.cl.responses.create(stream=True, **kw)]
            assert events[0].type == "response.created"
            r = events[-1].response
        else:
            r = await self.cl.responses.create(**kw)
        self.last = r.id
        out = [item.model_dump(exclude_none=True) for item in r.output]
        self.items += out
        self.new = []
        return [item.call_id for item in r.output if item.type == "function_call"]

    def answer(self, ids, observations):
        new = [{"type": "function_call_output", "call_id": i, "output": o["content"]}
               for i, o in zip(ids, observations, strict=True)]
        self.items += new
        self.new += new


class MessagesDriver:
    """The same loop through Anthropic's Messages API (the official anthropic client)."""

    def __init__(self, cl, system, question, tools, stream):
        self.cl, self.system, self.stream = cl, system, stream
        self.tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                       "input_schema": t["function"]["parameters"]} for t in tools]
        self.messages = [{"role": "user", "content": question}]

    async def ask(self, max_tokens):
        kw = {"model": MODEL, "system": self.system, "messages": self.messages,
              "tools": self.tools, "max_tokens": max_tokens, "extra_body": {"temperature": 0}}
        if self.stream:
            async with self.cl.messages.stream(**kw) as s:
                m = await s.get_final_message()
        else:
            m = await self.cl.messages.create(**kw)
        self.messages.append({"role": "assistant", "content": [
            b.model_dump(exclude_none=True, exclude={"parsed_output"}) for b in m.content]})
        return [b.id for b in m.content if b.type == "tool_use"]

    def answer(self, ids, observations):
        self.messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": i, "content": o["content"]}
            for i, o in zip(ids, observations, strict=True)]})


async def _drive(api, server, eid, stream, max_tokens):
    """A 3-turn Calculator episode on one API: the gateway's reply goes to the env (whose
    scripted parser reads the same calls), the env's observations go back as tool results."""
    import anthropic

    env, row = _calculator()
    messages, info = env.reset(options=row)
    system, question = messages[0]["content"], messages[1]["content"]
    try:
        if api == "messages":
            cl = anthropic.AsyncAnthropic(base_url=server.anthropic_url(eid), api_key="x",
                                          max_retries=0)
            driver = MessagesDriver(cl, system, question, info["tools"], stream)
        else:
            cl = openai.AsyncOpenAI(base_url=server.episode_url(eid), api_key="x", max_retries=0)
            driver = (ChatDriver(cl, system, question, info["tools"], stream) if api == "chat"
                      else ResponsesDriver(cl, system, question, info["tools"], stream,
                                           chained=api == "responses-chained"))
        async with cl:
            for _ in range(3):
                ids = await driver.ask(max_tokens)
                obs, _, terminated, truncated, _ = env.step("(any text: the parser is scripted)")
                if terminated or truncated:
                    return row
                driver.answer(ids, obs)
    finally:
        env.close()
    raise AssertionError("the scripted episode did not end in 3 turns")


def test_one_calculator_episode_gives_one_capture_through_every_api(engine, gateway, server):
    """Parallel calls, a tool error, a final answer: Chat Completions, Responses (whole input,
    and chained by previous_response_id) and Messages, each streamed and not, give exactly the
    env loop's tokens, loss mask and log-probs."""
    per_turn = 12
    runner = EpisodeRunner(engine, gateway.renderer, EpisodeConfig(
        sampling=SamplingConfig(temperature=0.0, max_tokens=per_turn), max_turns=3,
        max_prompt_len=512, max_response_len=480))
    env, row = _calculator()
    ref = _run(runner.run(env, row, seed=0))
    env.close()
    assert ref.num_turns == 3 and ref.finish_reason == "terminated", ref.error
    assert [len(t.results) for t in ref.turns] == [2, 1, 1] and ref.turns[1].results[0].error
    want = ref.tokens
    gw = Gateway(engine, gateway.renderer, model=MODEL, max_tokens=48)
    with GatewayServer(gw) as srv:
        for api in ("chat", "responses", "responses-chained", "messages"):
            for stream in (False, True):
                gw.parser = ScriptedCalculator()
                eid = gw.open_episode(temperature=0.0)
                _run(_drive(api, srv, eid, stream, per_turn))
                capture = gw.close_episode(eid)
                traj, samples = capture.trajectory(row, format="hermes")
                where = f"{api}, stream={stream}"
                assert len(capture.calls) == 3 and capture.splits == 0, where
                assert {c.api for c in capture.calls} == \
                    {"chat.completions" if api == "chat" else api.split("-")[0]}, where
                [s] = samples
                got = s.tokens
                assert got.prompt_ids == want.prompt_ids, where
                assert got.response_ids == want.response_ids, where
                assert got.response_mask == want.response_mask, where
                assert got.log_probs == pytest.approx(want.log_probs, abs=1e-6), where
                assert [t.action_span for t in traj.turns] == \
                    [t.action_span for t in ref.turns], where
                assert [[r.name for r in t.results] for t in traj.turns[:2]] == \
                    [["add", "mul"], ["div"]], where


# --- the Responses and Messages routes: documented shapes, refusals -----------------------------
RESPONSES_TOOLS = [{"type": "function", "strict": True, **t["function"]} for t in TOOLS]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]


def _events(text: str) -> list[tuple[str, dict]]:
    """Server-sent events as (event name, JSON data)."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines.get("event"), json.loads(lines["data"])))
    return out


def _strict(model, data):
    """Validate ``data`` against an SDK's pydantic type (their clients only construct)."""
    from pydantic import TypeAdapter

    return TypeAdapter(model).validate_python(data)


def test_responses_answer_in_the_documented_shapes(server):
    from openai.types.responses import Response, ResponseStreamEvent

    url = f"{server.base_url}/responses"
    body = {"model": MODEL, "instructions": "Use the tools.", "input": "What is 2 plus 3?",
            "tools": RESPONSES_TOOLS, "tool_choice": {"type": "function", "name": "add"},
            "max_output_tokens": 100, "temperature": 1.0}  # a call is at most ~70 characters
    r = httpx.post(url, json=body, timeout=60).json()
    resp = _strict(Response, r)
    [call] = resp.output
    assert resp.status == "completed" and call.type == "function_call" and call.name == "add"
    assert call.call_id.startswith("call_") and set(json.loads(call.arguments)) == {"a", "b"}
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    text = httpx.post(url, json={"model": MODEL, "input": MESSAGES[1:], "max_output_tokens": 6,
                                 "include": ["message.output_text.logprobs"]},
                      timeout=60).json()
    resp = _strict(Response, text)
    [message] = resp.output
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert len(message.content[0].logprobs) == resp.usage.output_tokens == 6
    for streamed in ({**body, "stream": True}, {"model": MODEL, "input": "hi", "stream": True,
                                                "max_output_tokens": 6}):
        with httpx.stream("POST", url, json=streamed, timeout=60) as s:
            events = _events(s.read().decode())
        assert all(name == data["type"] for name, data in events)
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        for _, data in events:
            _strict(ResponseStreamEvent, data)
        kinds = [name for name, _ in events]
        assert kinds[:3] == ["response.created", "response.in_progress",
                             "response.output_item.added"]
        assert kinds[-2:] == ["response.output_item.done", "response.completed"
                              if "tools" in streamed else "response.incomplete"]
        final = events[-1][1]["response"]
        if "tools" in streamed:
            assert "response.function_call_arguments.done" in kinds
            assert final["output"][0]["type"] == "function_call"
        else:
            deltas = "".join(d["delta"] for k, d in events if k == "response.output_text.delta")
            assert deltas == final["output"][0]["content"][0]["text"]


def test_messages_answer_in_the_documented_shapes(server):
    from anthropic.types import Message, RawMessageStreamEvent

    url = f"{server.url}/v1/messages"
    body = {"model": MODEL, "system": "Use the tools.", "max_tokens": 100,  # >= a call's chars
            "messages": [{"role": "user", "content": [{"type": "text", "text": "2 plus 3?"}]}],
            "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "any"}}
    m = _strict(Message, httpx.post(url, json=body, timeout=60).json())
    assert m.stop_reason == "tool_use" and m.content[-1].type == "tool_use"
    assert m.content[-1].id.startswith("toolu_") and m.content[-1].name in ("add", "submit")
    # stop_sequences: cut a greedy reply at a piece of itself
    plain = {"model": MODEL, "max_tokens": 8, "temperature": 0,
             "messages": [{"role": "user", "content": "hi"}]}
    full = _strict(Message, httpx.post(url, json=plain, timeout=60).json())
    assert full.stop_reason == "max_tokens" and full.usage.output_tokens == 8
    text = full.content[0].text
    stop = next(text[k:k + 2] for k in range(1, len(text) - 1)
                if text.index(text[k:k + 2]) == k)  # its first occurrence, past the start
    cut = _strict(Message, httpx.post(url, json={**plain, "stop_sequences": [stop]},
                                      timeout=60).json())
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[:text.index(stop)]
    for streamed in ({**body, "stream": True}, {**plain, "stream": True}):
        with httpx.stream("POST", url, json=streamed, timeout=60) as s:
            events = _events(s.read().decode())
        assert all(name == data["type"] for name, data in events)
        kinds = [name for name, _ in events if name != "ping"]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
        assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
        for name, data in events:
            if name != "ping":
                _strict(RawMessageStreamEvent, data)
        delta = events[-2][1]["delta"]
        assert delta["stop_reason"] == ("tool_use" if "tools" in streamed else "max_tokens")


def _error_shape(api, r):
    from anthropic.types.shared import ErrorResponse
    from openai.types.shared import ErrorObject

    if api == "messages":
        err = _strict(ErrorResponse, r.json()).error
        assert err.type == {400: "invalid_request_error", 404: "not_found_error"}[r.status_code]
        return err.message
    err = _strict(ErrorObject, r.json()["error"])
    return err.param


@pytest.mark.parametrize(("api", "changes", "status", "where"), [
    ("responses", {"input": [{"type": "input_image", "image_url": "x"}]}, 400, "input[0].type"),
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, 400,
     "input[0].content[0]"),
    ("responses", {"tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ("responses", {"background": True}, 400, "background"),
    ("responses", {"truncation": "auto"}, 400, "truncation"),
    ("responses", {"reasoning": {"effort": "high"}}, 400, "reasoning"),
    ("responses", {"text": {"format": {"type": "json_object"}}}, 400, "text"),
    ("responses", {"parallel_tool_calls": False}, 400, "parallel_tool_calls"),
    ("responses", {"tools": RESPONSES_TOOLS, "tool_choice": {"type": "function", "name": "x"}},
     400, "tool_choice"),
    ("responses", {"temperature": 3}, 400, "temperature"),
    ("responses", {"seed": 1}, 400, "seed"),
    ("responses", {"previous_response_id": "resp_1"}, 400, "previous_response_id"),
    ("responses", {"model": "gpt-5"}, 404, "model"),
    ("messages", {"max_tokens": None}, 400, "max_tokens: Field required"),
    ("messages", {"messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400,
     "messages.0.content.0"),
    ("messages", {"messages": [{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "The answer is"}]}, 400,
     "prefill"),
    ("messages", {"tools": [{"type": "bash_20250124", "name": "bash"}]}, 400, "tools.0"),
    ("messages", {"thinking": {"type": "enabled", "budget_tokens": 1024}}, 400, "thinking"),
    ("messages", {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "any",
                                                            "disable_parallel_tool_use": True}},
     400, "disable_parallel_tool_use"),
    ("messages", {"temperature": 1.5}, 400, "temperature"),
    ("messages", {"frobnicate": 1}, 400, "frobnicate: Extra inputs are not permitted"),
    ("messages", {"model": "claude-x"}, 404, "does not exist"),
])
def test_bad_requests_get_each_apis_error_shape(server, api, changes, status, where):
    body = ({"model": MODEL, "input": "hi", "max_output_tokens": 4} if api == "responses" else
            {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    body = {k: v for k, v in {**body, **changes}.items() if v is not None}
    r = httpx.post(f"{server.url}/v1/{api}", json=body, timeout=30)
    assert r.status_code == status, r.text
    got = _error_shape(api, r)
    assert (where in got) if api == "messages" else got == where


def test_malformed_requests_leave_the_episode_and_the_worker_whole(gateway, server):
    """Refusals on an episode's route capture nothing; the route (and the server) serve the
    next good call; unknown episodes and unknown response ids are 404 / 400 in the API's
    shape; the official clients raise their own error classes."""
    import anthropic

    eid = gateway.open_episode(temperature=0.0)
    base = f"{server.url}/episodes/{eid}/v1"
    try:
        for api, body in [("responses", b"{not json"), ("messages", b"[1, 2"),
                          ("responses", {"model": MODEL, "input": 5}),
                          ("responses", {"model": MODEL, "input": "x",
                                         "previous_response_id": "resp_nope"}),
                          ("messages", {"model": MODEL, "max_tokens": 4, "messages": []}),
                          ("messages", {"model": MODEL, "max_tokens": 4,
                                        "messages": [{"role": "user", "content": [
                                            {"type": "tool_result"}]}]})]:
            kw = {"content": body} if isinstance(body, bytes) else {"json": body}
            r = httpx.post(f"{base}/{api}", timeout=30, **kw)
            assert r.status_code == 400, r.text
            _error_shape(api, r)
        assert gateway.episodes[eid].calls == []
        oc = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
        ac = anthropic.Anthropic(base_url=server.anthropic_url(eid), api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            oc.responses.create(model=MODEL, input="x", previous_response_id="resp_nope")
        assert e.value.code == "previous_response_not_found"
        with pytest.raises(anthropic.BadRequestError) as e:
            ac.messages.create(model=MODEL, max_tokens=4, messages=[
                {"role": "user", "content": "1 " * 2000}])
        assert e.value.body["error"]["type"] == "invalid_request_error"
        assert "maximum context length" in e.value.message
        first = oc.responses.create(model=MODEL, input="hi", max_output_tokens=4, store=False)
        with pytest.raises(openai.BadRequestError):  # store=false: nothing to continue
            oc.responses.create(model=MODEL, input="go on", previous_response_id=first.id)
        ok = ac.messages.create(model=MODEL, max_tokens=4, messages=[
            {"role": "user", "content": "hi"}])
        assert ok.usage.output_tokens == 4 and len(gateway.episodes[eid].calls) == 2
    finally:
        capture = gateway.close_episode(eid)
    assert capture.overflow  # the long prompt was refused (the policy's overflow), not sampled
    with pytest.raises(anthropic.NotFoundError):
        ac.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.NotFoundError) as e:
        oc.responses.create(model=MODEL, input="x")
    assert e.value.code == "episode_not_found"


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_rewritten_history_starts_a_second_sample_in_every_api(gateway, server, api):
    import anthropic

    eid = gateway.open_episode(temperature=1.0, seed=5)
    try:
        if api == "responses":
            cl = openai.OpenAI(base_url=server.episode_url(eid), api_key="x", max_retries=0)
            first = cl.responses.create(model=MODEL, instructions=MESSAGES[0]["content"],
                                        input=MESSAGES[1]["content"], max_output_tokens=8)
            cl.responses.create(model=MODEL, instructions=MESSAGES[0]["content"],
                                previous_response_id=first.id,
                                input=[{"role": "user", "content": "Go on."}],
                                max_output_tokens=8)
            cl.responses.create(model=MODEL, instructions=MESSAGES[0]["content"],
                                input="Summary so far: 2 + 3.", max_output_tokens=8)
        else:
            cl = anthropic.Anthropic(base_url=server.anthropic_url(eid), api_key="x",
                                     max_retries=0)
            history = [{"role": "user", "content": MESSAGES[1]["content"]}]
            first = cl.messages.create(model=MODEL, system=MESSAGES[0]["content"],
                                       messages=history, max_tokens=8)
            history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                          for b in first.content]},
                        {"role": "user", "content": "Go on."}]
            cl.messages.create(model=MODEL, system=MESSAGES[0]["content"], messages=history,
                               max_tokens=8)
            cl.messages.create(model=MODEL, system=MESSAGES[0]["content"], max_tokens=8,
                               messages=[{"role": "user", "content": "Summary so far: 2 + 3."}])
    finally:
        capture = gateway.close_episode(eid)
    assert [c.extends for c in capture.calls] == [False, True, False]
    assert capture.splits == 1 and len(capture.samples()) == 2
