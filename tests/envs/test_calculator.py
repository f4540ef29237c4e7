"""toolrl/Calculator-v0: task generator, outcome, tool errors."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from toolrl.envs.calculator import CalculatorEnv

from toolrl.core.env import run_episode
from toolrl.core.registration import make_env


def call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.fixture
def env():
    e = make_env("toolrl/Calculator-v0")
    yield e
    e.close()


def test_generator_is_seeded_and_scaled_by_difficulty():
    assert CalculatorEnv.make_tasks(5, seed=1) == CalculatorEnv.make_tasks(5, seed=1)
    assert CalculatorEnv.make_tasks(5, seed=1) != CalculatorEnv.make_tasks(5, seed=2)
    assert CalculatorEnv.make_tasks(5, seed=1) != CalculatorEnv.make_tasks(5, seed=1, split="val")
    for d in (1, 2, 3, 4):
        for row in CalculatorEnv.make_tasks(20, seed=d, difficulty=d):
            assert len(row["plan"]) == d and row["category"] == f"d{d}"
            if d == 1:
                assert all(0 <= abs(x) <= 120 for x in row["plan"][0][1:])
                assert len(row["question"]) < 90
    with pytest.raises(ValueError, match="difficulty"):
        CalculatorEnv.make_tasks(1, difficulty=5)


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_no_other_tool_gives_the_answer_of_a_step(difficulty):
    """A step that two tools answer (``2 + 2 == 2 * 2``, ``5 * 1 == 5 / 1``) would reward a
    wrong choice of tool: the generator never makes one, and keeps the operations balanced."""
    import operator
    apply = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
             "div": operator.truediv, "pow": operator.pow}
    rows = CalculatorEnv.make_tasks(400, seed=3, difficulty=difficulty, style="plain")
    for row in rows:
        for op, a, b in row["plan"]:
            want = apply[op](a, b)
            same = [o for o in apply if o != op and not (o == "div" and b == 0)
                    and abs(apply[o](a, b) - want) <= 1e-9 * max(1.0, abs(want))]
            assert same == [], (row["question"], op, a, b, same)
    if difficulty == 1:
        counts = {op: sum(r["plan"][0][0] == op for r in rows) for op in apply}
        assert min(counts.values()) > 0.6 * max(counts.values()), counts


def test_system_prompt_and_tools_are_small():
    env = CalculatorEnv()
    _, info = env.reset(seed=0)
    assert len(env.system_prompt) < 80
    assert [t["function"]["name"] for t in info["tools"]] == ["add", "sub", "mul", "div", "pow",
                                                              "submit"]
    assert len(json.dumps(info["tools"])) < 1500


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_scripted_policy_solves_every_difficulty(env, difficulty):
    for row in CalculatorEnv.make_tasks(10, seed=difficulty, difficulty=difficulty):
        ep = asyncio.run(run_episode(env, row=row))
        assert ep.success and ep.finish_reason == "terminated" and ep.info["success"] is True
        assert len(ep.turns) == difficulty + 1 and not ep.errors


def test_outcome_is_the_exact_answer_within_tolerance(env):
    row = {"id": "x", "question": "What is 2 plus 5?", "ground_truth": 7}
    for answer, success in [(7, True), (7.0000001, True), (7.1, False), (-7, False)]:
        env.reset(options=row)
        _, reward, terminated, _, info = env.step(call("submit", answer=answer))
        assert terminated and info["success"] is success and reward == float(success)
    env.reset(options=row)
    _, reward, terminated, _, info = env.step("The answer is 7.")
    assert terminated and info["success"] is False  # the answer must be submitted


def test_tool_errors_keep_the_episode_going(env):
    env.reset(options={"id": "x", "question": "q", "ground_truth": 1})
    obs, _, terminated, _, info = env.step(call("div", a=1, b=0) + call("add", a="one", b=2))
    assert not terminated
    assert [e["type"] for e in info["errors"]] == ["tool_exception", "wrong_type"]
    assert "ZeroDivisionError" in obs[0]["content"]
    obs, *_ = env.step(call("mul", a=6, b=7) + call("pow", a=2, b=10) + call("sub", a=1, b=3))
    assert [m["content"] for m in obs] == ["42", "1024", "-2"]
    assert re.fullmatch(r"-?\d+", obs[2]["content"])


@pytest.mark.parametrize("difficulty", [1, 3])
def test_random_op_oracle_keeps_the_format_and_operands_but_not_the_operation(difficulty):
    env = make_env("toolrl/Calculator-v0", oracle="random_op")
    rows = CalculatorEnv.make_tasks(200, seed=difficulty, difficulty=difficulty)
    wrong_op = solved = 0
    try:
        for row in rows:
            ep = asyncio.run(run_episode(env, row=row))
            # every call is well-formed and runs
            assert ep.finish_reason == "terminated" and not ep.errors
            calls = [json.loads(re.fullmatch(r"<tool_call>(.*)</tool_call>", m["content"])[1])
                     for m in ep.messages if m["role"] == "assistant"]
            results = [m["content"] for m in ep.messages if m["role"] == "tool"]
            assert [c["arguments"]["b"] for c in calls[:-1]] == [b for _, _, b in row["plan"]]
            assert calls[0]["arguments"]["a"] == row["plan"][0][1]
            assert calls[-1]["name"] == "submit"
            assert json.loads(results[-2]) == calls[-1]["arguments"]["answer"]  # what came back
            ops = [c["name"] for c in calls[:-1]]
            wrong_op += ops != [op for op, _, _ in row["plan"]]
            solved += ep.success
    finally:
        env.close()
    assert wrong_op > 0.5 * len(rows) and solved < 0.6 * len(rows)
    with pytest.raises(ValueError, match="oracle"):
        CalculatorEnv(oracle="psychic")
