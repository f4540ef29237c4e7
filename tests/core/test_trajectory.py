"""`Trajectory`, the one record of a finished episode: JSON round trip (property), what
`run_episode` records, and clear errors."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toolrl
from toolrl import ParseError, ParseResult, ToolCall, ToolOutput, Trajectory, TurnRecord
from toolrl.core.trajectory import FINISH_REASONS, TokenStream

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies: any JSON a row, message, info or state may hold ---------------------------
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
floats = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | floats | names,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=12)
json_objects = st.dictionaries(names, json_values, max_size=4)
spans = st.none() | st.tuples(st.integers(0, 10_000), st.integers(0, 10_000))
calls = st.builds(ToolCall, name=names, arguments=json_objects, id=st.none() | names)
parse_errors = st.builds(ParseError, kind=names, message=names, span=spans)
parses = st.builds(ParseResult, calls=st.lists(calls, max_size=3), text=names,
                   errors=st.lists(parse_errors, max_size=2), repaired=st.booleans())
errors = st.fixed_dictionaries({"type": st.sampled_from(sorted(toolrl.ERROR_TYPES)),
                                "tool": st.none() | names, "message": names})
outputs = st.builds(ToolOutput, name=names, content=names, error=st.none() | errors,
                    latency=st.floats(0, 100))
turns = st.builds(TurnRecord, action=names, parse=parses, results=st.lists(outputs, max_size=3),
                  errors=st.lists(errors, max_size=3), reward=st.none() | floats,
                  env_reward=floats, action_span=spans, observation_span=spans,
                  finish_reason=st.sampled_from(["stop", "length", "abort"]),
                  generate_s=st.floats(0, 100), env_s=st.floats(0, 100))
token_streams = st.builds(TokenStream, prompt_ids=st.lists(st.integers(0, 2**31), max_size=8),
                          response_ids=st.lists(st.integers(0, 2**31), max_size=8),
                          response_mask=st.lists(st.integers(0, 1), max_size=8),
                          log_probs=st.lists(st.floats(-50, 0), max_size=8))
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": names},
    optional={"name": names, "tool_call_id": names}), max_size=4)
trajectories = st.builds(
    Trajectory, messages=messages, turns=st.lists(turns, max_size=3), row=json_objects,
    tools=st.lists(json_objects, max_size=2), format=st.none() | names,
    finish_reason=st.sampled_from(FINISH_REASONS), success=st.booleans(), info=json_objects,
    final_state=st.none() | json_objects, error=st.none() | names,
    seed=st.none() | st.integers(0, 2**31), uid=st.none() | names,
    policy_version=st.none() | st.integers(0, 10**6), prompt_tokens=st.integers(0, 10**6),
    response_tokens=st.integers(0, 10**6), sampled_tokens=st.integers(0, 10**6),
    timing=st.dictionaries(names, st.floats(0, 1e4), max_size=3),
    tokens=st.none() | token_streams, extra=json_objects)


@given(trajectories)
@SETTINGS
def test_property_json_round_trip_is_lossless(traj):
    wire = json.dumps(traj.to_dict())
    back = Trajectory.from_dict(json.loads(wire))
    assert back == traj
    assert json.dumps(back.to_dict()) == wire


def test_from_dict_rejects_unknown_keys_and_finish_reasons():
    with pytest.raises(ValueError, match=r"unknown trajectory key.*'num_tokens'"):
        Trajectory.from_dict({"num_tokens": 3})
    with pytest.raises(ValueError, match="unknown finish reason 'stop'"):
        Trajectory(finish_reason="stop")
    with pytest.raises(TypeError, match="a Trajectory or a mapping"):
        Trajectory.from_dict([1, 2])


def test_run_episode_records_the_envs_parse_results_errors_and_rewards():
    env = toolrl.make_env("toolrl/Bank-v0")
    try:
        row = env.unwrapped.make_tasks(1, seed=0)[0]
        traj = asyncio.run(toolrl.run_episode(env, row=row, seed=0))
    finally:
        env.close()
    assert traj.success and traj.finish_reason == "terminated" and traj.row == row
    assert traj.final_state == row["expected_state"] and traj.info["success"] is True
    assert [m["role"] for m in traj.messages].count("assistant") == traj.num_turns
    for turn in traj.turns:
        # the env's own parse of the action, and one output per call that ran
        assert turn.parse == env.unwrapped.parser.parse(turn.action)
        assert [r.name for r in turn.results] == [c.name for c in turn.calls]
        assert all(r.ok and r.latency >= 0 for r in turn.results) and turn.errors == []
    # Bank pays a per-turn reward (-0.1 per mistake; none here) and the outcome at the end
    assert all(t.reward is not None for t in traj.turns)
    assert traj.env_reward == pytest.approx(sum(t.reward for t in traj.turns) + 1.0)
    assert traj.tokens is None and traj.tools == env.unwrapped.tools_schema()


def test_finish_keeps_info_as_plain_data_and_always_says_success():
    traj = Trajectory()
    parse = ParseResult(calls=[ToolCall("f", {})], text="")
    traj.finish("length", {"parse": parse, "calls": parse.calls, "turn": 3}, {"n": (1, 2)})
    assert traj.info == {"turn": 3, "success": False} and traj.success is False
    assert traj.final_state == {"n": [1, 2]}
    json.dumps(traj.to_dict())
