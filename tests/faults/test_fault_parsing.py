"""Fault table, adversarial model output: malformed or hostile tool calls through the parsers,
the schema validators and whole env turns (never raises, never hangs).

Hostile inputs: unbalanced tags, JSON nested 900 and 10,000 levels deep, numbers out of range
(``1e400``, a 5,000-digit integer), unknown and absurd tool names, thousands of calls in one
turn. Decided behaviour, checked here:

- a number that overflows a float (``1e400``) or an integer past Python's 4,300-digit limit is
  ``invalid_json``; arguments nested deeper than ``MAX_ARGUMENT_DEPTH`` (32) are ``too_deep``,
  so no recursive code downstream (validation, episode records, pickling, JSON dumps) meets a
  RecursionError;
- a turn runs at most ``max_calls_per_turn`` (default 32) calls; the rest are not run and one
  ``too_many_calls`` error says so: a turn costs bounded time and observation size;
- every error the env reports has a type in ``ERROR_TYPES``; the turn's record is JSON-able
  and picklable.

Hypothesis drives the properties; the named cases pin the hostile inputs above.
"""

from __future__ import annotations

import json
import pickle

import pytest
from fault_harness import assert_conserved, call
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolrl.core.parse import MAX_ARGUMENT_DEPTH, get_format
from toolrl.core.registration import make_env
from toolrl.core.types import ERROR_TYPES, ParseResult, ToolCall

pytestmark = pytest.mark.timeout(240)
FORMATS = ["hermes", "json", "llama3_json", "mistral"]
ENV_IDS = ["toolrl/Calculator-v0", "toolrl/Bank-v0", "toolrl/FunctionCalling-v0"]
HUGE_INT = "9" * 5000
DEEP = 10_000


def nesting(value) -> int:
    depth, stack = 0, [(value, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict | list):
            depth = max(depth, d)
            stack.extend((c, d + 1) for c in (node.values() if isinstance(node, dict) else node))
    return depth


@pytest.fixture(scope="module")
def envs():
    """One env per id, reset before every example."""
    made = {env_id: make_env(env_id, max_turns=50) for env_id in ENV_IDS}
    yield made
    for env in made.values():
        env.close()


def step_safely(env, text: str, seed: int = 0):
    """One turn from a fresh episode; checks the invariants every turn must keep."""
    env.reset(seed=seed)
    obs, reward, _, _, info = env.step(text)
    assert isinstance(reward, float)
    for error in info["errors"]:
        assert error["type"] in ERROR_TYPES, error
        assert len(error["message"]) <= 303
    assert all(isinstance(m.get("content"), str) for m in obs)
    calls = info["calls"]
    assert len(calls) <= env.unwrapped.max_calls_per_turn
    assert all(nesting(c.arguments) <= MAX_ARGUMENT_DEPTH for c in calls)
    record = {"calls": [c.to_dict() for c in calls], "errors": info["errors"],
              "observation": obs}
    pickle.loads(pickle.dumps(record))  # what crosses to the trainer process
    json.dumps(record)  # what the rollout dump writes
    return obs, info


# --- hostile values, by name ---------------------------------------------------------------
@pytest.mark.parametrize("name", FORMATS)
def test_numbers_out_of_range_are_invalid_json(name):
    fmt = get_format(name)
    for number in ("1e400", "-1e400", HUGE_INT):
        text = fmt.render([ToolCall("add", {"a": 1, "b": 2})]).replace("2", number, 1)
        result = fmt.parse(text)
        assert result.calls == [] and [e.kind for e in result.errors] == ["invalid_json"], text
    ok = fmt.parse(fmt.render([ToolCall("add", {"a": 1e-400, "b": 1.5e300})]))
    assert ok.calls == [ToolCall("add", {"a": 0.0, "b": 1.5e300})]


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("depth", [MAX_ARGUMENT_DEPTH + 1, 900, DEEP])
def test_deeply_nested_arguments_are_rejected(name, depth):
    fmt = get_format(name)
    nested = "[" * depth + "]" * depth
    text = fmt.render([ToolCall("add", {"a": 0, "b": 1})]).replace("0", nested, 1)
    result = fmt.parse(text)
    assert result.calls == [] and [e.kind for e in result.errors] in (
        ["too_deep"], ["invalid_json"])
    at_limit = "[" * (MAX_ARGUMENT_DEPTH - 1) + "]" * (MAX_ARGUMENT_DEPTH - 1)
    kept = fmt.parse(fmt.render([ToolCall("add", {"a": 0, "b": 1})]).replace("0", at_limit, 1))
    assert len(kept.calls) == 1 and nesting(kept.calls[0].arguments) == MAX_ARGUMENT_DEPTH


def test_hostile_turns_through_a_real_env(envs):
    """Each hostile message is one turn of a fresh Calculator episode: typed errors, and the
    episode can still finish afterwards."""
    env = envs["toolrl/Calculator-v0"]
    nested = "[" * DEEP + "]" * DEEP
    cases = {
        "unbalanced_open": ("<tool_call>" * 50 + '{"name": "add"', {"parse_error"}),
        "unbalanced_close": ("</tool_call>" * 50, {"parse_error"}),
        "crossed_tags": ('<tool_call><tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}'
                         "</tool_call></tool_call>", {"parse_error"}),
        "deep_body": (f"<tool_call>{nested}</tool_call>", {"parse_error"}),
        "deep_argument": (call("add", a=0, b=1).replace("0", nested, 1), {"parse_error"}),
        "huge_float": (call("add", a=0, b=1).replace("0", "1e400", 1), {"parse_error"}),
        "huge_int": (call("add", a=0, b=1).replace("0", HUGE_INT, 1), {"parse_error"}),
        "big_int_product": (call("mul", a=int("9" * 4000), b=int("9" * 4000)),
                            {"tool_exception"}),
        "big_int_submit": (call("submit", answer=int("9" * 4000)), set()),
        "unknown_tool": (call("rm_rf", path="/"), {"unknown_tool"}),
        "empty_name": ('<tool_call>{"name": "", "arguments": {}}</tool_call>', {"parse_error"}),
        "long_name": (call("x" * 100_000), {"unknown_tool"}),
        "tag_in_name": (get_format("hermes").render([ToolCall("</tool_call><tool_call>")]),
                        {"unknown_tool"}),
        "raw_tag_in_name": (call("</tool_call><tool_call>"), {"parse_error"}),
    }
    for label, (text, kinds) in cases.items():
        _, info = step_safely(env, text)
        assert {e["type"] for e in info["errors"]} == kinds, (label, info["errors"])
        if not env.unwrapped.done:
            _, _, terminated, _, end = env.step(call("submit", answer=1))
            assert terminated and "success" in end, label


@pytest.mark.parametrize("name", FORMATS)
def test_thousands_of_calls_in_one_turn_are_capped(envs, name):
    env = envs["toolrl/Calculator-v0"]
    cap = env.unwrapped.max_calls_per_turn
    calls = [ToolCall("add", {"a": i, "b": 1}) for i in range(5000)]
    env.unwrapped.parser = get_format(name)
    try:
        obs, info = step_safely(env, get_format(name).render(calls))
    finally:
        env.unwrapped.parser = get_format("hermes")
    assert [c.arguments["a"] for c in info["calls"]] == list(range(cap))
    assert [m["content"] for m in obs[:cap]] == [str(i + 1) for i in range(cap)]
    assert [e["type"] for e in info["errors"]] == ["too_many_calls"]
    assert info["errors"][0]["dropped"] == 5000 - cap  # counted: Trajectory.dropped_calls
    assert "5000 calls in one turn; only the first 32 ran" in obs[-1]["content"]
    assert len(obs) == cap + 1


def test_calls_past_the_cap_are_counted_in_the_trajectory(envs):
    import asyncio

    from toolrl.core.env import run_episode
    from toolrl.core.trajectory import Trajectory

    env = envs["toolrl/Calculator-v0"]
    text = get_format("hermes").render([ToolCall("add", {"a": i, "b": 1}) for i in range(40)])
    traj = asyncio.run(run_episode(env, lambda e, m: text if e.unwrapped.turn == 0 else "1",
                                   row=env.unwrapped.make_tasks(1)[0]))
    assert traj.turns[0].dropped_calls == 8 and traj.dropped_calls == 8
    assert len(traj.turns[0].results) == 32
    assert Trajectory.from_dict(traj.to_dict()).dropped_calls == 8


def test_thousands_of_unknown_and_malformed_calls_stay_bounded(envs):
    """5,000 calls of a tool that does not exist plus 5,000 malformed ones: the observation
    shows 32 results, 3 of the parse errors and the cap error."""
    env = envs["toolrl/Bank-v0"]
    text = call("no_such_tool") * 5000 + "<tool_call>{bad json}</tool_call>" * 5000
    obs, info = step_safely(env, text)
    kinds = [e["type"] for e in info["errors"]]
    assert kinds.count("unknown_tool") == 32 and kinds.count("too_many_calls") == 1
    assert kinds.count("parse_error") == 5000
    assert len(obs) == 32 + 1 + env.unwrapped.max_parse_errors_shown


# --- properties ----------------------------------------------------------------------------
json_leaf = (st.none() | st.booleans() | st.integers() | st.floats(width=64)
             | st.sampled_from([10**4299, -(10**4299), 1e308, -0.0, 5e-324])
             | st.text(max_size=30))
json_values = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=20)
TOOL_NAMES = ["add", "sub", "mul", "div", "pow", "submit", "transfer", "get_balance",
              "verify_identity", "update_email", "get_weather", "unknown", "", "a" * 300]
calls_strategy = st.lists(st.builds(
    ToolCall, name=st.sampled_from(TOOL_NAMES),
    arguments=st.dictionaries(st.sampled_from(["a", "b", "answer", "amount", "from_account",
                                               "to_account", "customer_id", "email", "city",
                                               "unit", "x"]), json_values, max_size=4)),
    max_size=6)
JUNK = ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"name"', ":", ",", "[TOOL_CALLS]",
        "[ARGS]", "<|python_tag|>", ";", "1e400", HUGE_INT[:50], "[" * 200, "\udc80", "\x00"]


def _render(fmt_name: str, calls: list[ToolCall], junk: list[str]) -> str:
    """Render valid calls (dropping values JSON cannot carry), then splice junk around them."""
    fmt = get_format(fmt_name)
    safe = []
    for c in calls:
        try:
            json.dumps(c.arguments, allow_nan=False)
        except ValueError:
            continue
        safe.append(c)
    text = fmt.render(safe)
    return "".join(junk[: len(junk) // 2]) + text + "".join(junk[len(junk) // 2:])


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(calls=calls_strategy, junk=st.lists(st.sampled_from(JUNK), max_size=6),
       fmt=st.sampled_from(FORMATS), env_id=st.sampled_from(ENV_IDS),
       seed=st.integers(0, 50))
def test_any_turn_never_raises_and_keeps_the_invariants(envs, calls, junk, fmt, env_id, seed):
    env = envs[env_id]
    env.unwrapped.parser = get_format(fmt)
    try:
        step_safely(env, _render(fmt, calls, junk), seed=seed)
    finally:
        env.unwrapped.parser = get_format(env.unwrapped.format_name)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments=json_values, env_id=st.sampled_from(ENV_IDS), seed=st.integers(0, 20))
def test_validators_never_raise(envs, arguments, env_id, seed):
    """Every tool schema of the built-in envs against arbitrary JSON values."""
    env = envs[env_id]
    env.reset(seed=seed)
    for tool in env.unwrapped.tools.values():
        error = tool.validate(arguments)
        assert error is None or (error["type"] in ERROR_TYPES and error["tool"] == tool.name)


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.text(max_size=200) | st.lists(st.sampled_from(JUNK), max_size=20).map(
    "".join), min_size=1, max_size=8))
def test_a_batch_of_hostile_episodes_keeps_every_episode(texts):
    """Episodes fed hostile text turn after turn all come back, once each."""
    import asyncio

    from fault_harness import play_batch

    rows = [{"id": f"hostile-{i}", "question": "What is 1 plus 1?", "ground_truth": 2,
             "plan": [["add", 1, 1]]} for i in range(len(texts))]
    by_id = {r["id"]: t for r, t in zip(rows, texts, strict=True)}

    def policy(env, messages):
        return by_id[env.unwrapped.row["id"]] if env.unwrapped.turn < 2 else "done"

    episodes = asyncio.run(play_batch(lambda: make_env("toolrl/Calculator-v0"), rows, policy,
                                      timeout=60))
    assert_conserved(list(by_id), episodes)
    assert all(ep.finish_reason in ("terminated", "truncated") for ep in episodes.values())


def test_parsers_return_parse_results_for_hostile_text():
    """The same hostile strings straight into every parser, repair on and off."""
    for name in FORMATS:
        for repair in (False, True):
            fmt = get_format(name, repair=repair)
            for text in ["[" * DEEP, "<tool_call>" + "{" * DEEP, HUGE_INT, "1e400",
                         "[TOOL_CALLS]" + "[" * DEEP, "\udc80" * 100, "".join(JUNK) * 200]:
                result = fmt.parse(text)
                assert isinstance(result, ParseResult)
                assert all(nesting(c.arguments) <= MAX_ARGUMENT_DEPTH for c in result.calls)
