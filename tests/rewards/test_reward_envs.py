"""Rewards on real episodes of the built-in envs: the reward and the env's own `success` come from
the same checker, so they must agree, for right and for wrong policies."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from toolrl.core.env import run_episode
from toolrl.core.parse import get_format
from toolrl.core.registration import make_env
from toolrl.core.reward import Trajectory, build_reward
from toolrl.core.types import ToolCall

HERMES = get_format("hermes")


def rewrite(transform):
    """A policy that rewrites the calls of the env's scripted (oracle) action."""

    def policy(env, messages):
        parsed = HERMES.parse(env.unwrapped.oracle_action())
        return HERMES.render(transform(parsed.calls), text=parsed.text)

    return policy


def shout(calls):
    return [ToolCall(c.name, {k: v.upper() + "." if isinstance(v, str) else v
                              for k, v in c.arguments.items()}) for c in calls]


def bump(calls):
    return [ToolCall(c.name, {k: v + 1 if type(v) is int else v for k, v in c.arguments.items()})
            for c in calls]


POLICIES = {
    "oracle": None,
    "shout": rewrite(shout),
    "reversed": rewrite(lambda calls: calls[::-1]),
    "drop_last": rewrite(lambda calls: calls[:-1]),
    "bump_ints": rewrite(bump),
    "always_call": rewrite(lambda calls: calls or [ToolCall("get_weather", {"city": "x"})]),
}


def episodes(env_id, rows, policy):
    env = make_env(env_id)
    try:
        out = []
        for row in rows:
            kwargs = {} if policy is None else {"policy": policy}
            ep = asyncio.run(asyncio.wait_for(run_episode(env, row=row, **kwargs), 60))
            _, info = env.reset(options=row)
            out.append((ep, Trajectory.from_episode(ep, row, tools=info["tools"],
                                                    format=info["format"])))
        return out
    finally:
        env.close()


@pytest.fixture(scope="module")
def fc_rows():
    env = make_env("toolrl/FunctionCalling-v0")
    rows = env.unwrapped.make_tasks(20, seed=3)
    env.close()
    assert {r["category"] for r in rows} == {"simple", "multiple", "parallel",
                                             "parallel_multiple", "irrelevance"}
    return rows


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_bfcl_ast_agrees_with_function_calling_success(fc_rows, policy):
    eps = episodes("toolrl/FunctionCalling-v0", fc_rows, POLICIES[policy])
    with build_reward(["bfcl_ast", {"name": "success", "alias": "env_success"}]) as fn:
        out = fn.score([t for _, t in eps])
    assert out.components["bfcl_ast"] == [1.0 if ep.success else 0.0 for ep, _ in eps]
    assert out.components["bfcl_ast"] == out.components["env_success"]
    if policy in ("oracle", "shout", "reversed"):
        assert all(ep.success for ep, _ in eps)  # normalization and any-order hold end to end
    if policy in ("drop_last", "bump_ints", "always_call"):
        assert not all(ep.success for ep, _ in eps)


def test_malformed_call_fails_bfcl_ast_strictly(fc_rows):
    def broken(env, messages):
        return env.unwrapped.oracle_action() + '<tool_call>{"name": </tool_call>'

    eps = episodes("toolrl/FunctionCalling-v0", fc_rows, broken)
    strict = build_reward(["bfcl_ast"]).score([t for _, t in eps])
    lenient = build_reward([{"name": "bfcl_ast", "kwargs": {"strict_parse": False}}]).score(
        [t for _, t in eps])
    for (ep, traj), s, loose in zip(eps, strict.scores, lenient.scores, strict=True):
        # BFCL decodes all or nothing: a malformed call fails the turn, and under irrelevance
        # makes it no call at all (a pass); the env judges the same way by default
        assert s == (1.0 if traj.row["category"] == "irrelevance" else 0.0)
        assert s == (1.0 if ep.success else 0.0)
        assert loose == 1.0  # lenient: the oracle's well-formed calls alone are judged


def test_answer_match_and_exec_state_agree_with_env_success():
    calc_rows = make_env("toolrl/Calculator-v0").unwrapped.make_tasks(6, seed=0)

    def wrong(env, messages):
        return HERMES.render([ToolCall("submit", {"answer": env.unwrapped.row["ground_truth"]
                                                  + 1})])

    for policy, expected in ((None, 1.0), (wrong, 0.0)):
        eps = episodes("toolrl/Calculator-v0", calc_rows, policy)
        out = build_reward(["answer_match", "success"]).score([t for _, t in eps])
        assert out.components["answer_match"] == out.components["success"] == [expected] * 6

    bank_rows = make_env("toolrl/Bank-v0").unwrapped.make_tasks(3, seed=0)
    eps = episodes("toolrl/Bank-v0", bank_rows, None)
    out = build_reward(["exec_state", "success", "tool_error_penalty", "format"]).score(
        [t for _, t in eps])
    assert out.components["exec_state"] == out.components["success"] == [1.0] * 3
    assert out.components["format"] == [1.0] * 3
    assert out.components["tool_error_penalty"] == [0.0] * 3
    # an episode's trajectory is plain JSON data (what the remote reward POSTs)
    wire = [json.loads(json.dumps(t.to_dict())) for _, t in eps]
    again = build_reward(["exec_state", "success", "tool_error_penalty", "format"]).score(wire)
    assert again.components == out.components

    def quit_early(env, messages):
        return "Sorry, I cannot help with that."

    eps = episodes("toolrl/Bank-v0", bank_rows, quit_early)
    out = build_reward(["exec_state", "success"]).score([t for _, t in eps])
    assert out.components["exec_state"] == out.components["success"] == [0.0] * 3
    assert all(re.match(r"state\.\w+", r) for r in out.reasons["exec_state"])  # says where
