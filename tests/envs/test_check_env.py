"""Every registered env passes `toolrl check-env` (gymnasium's check_env + toolrl's checks)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from toolrl.envs import BUILTIN_ENVS

from toolrl.core.checks import check_tool_env
from toolrl.core.registration import env_ids


def test_every_builtin_is_registered_through_the_entry_point():
    from importlib import metadata

    eps = {ep.name: ep.value for ep in metadata.entry_points(group="toolrl.envs")}
    assert eps.get("builtin") == "toolrl.envs"
    assert set(BUILTIN_ENVS) <= set(env_ids())


@pytest.mark.timeout(180)
@pytest.mark.parametrize("env_id", sorted(BUILTIN_ENVS))
def test_check_env(env_id):
    """The shipped envs, fixed at collection: ``env_ids()`` would also hold whatever another
    test module registered before this one was collected (the fault suite's env, which
    misbehaves on purpose), so the set depended on file order."""
    report = check_tool_env(env_id)
    assert report.ok, str(report)
    assert {r.name for r in report.results} >= {
        "gymnasium check_env", "tool schemas", "scripted policy", "call round trip",
        "seeded determinism", "episode isolation"}


def test_check_env_catches_a_broken_env():
    """The checks can fail: a non-deterministic env with a wrong oracle is reported."""
    import random

    from toolrl.core.env import ToolEnv
    from toolrl.core.registration import register_env
    from toolrl.core.tools import tool

    class Flaky(ToolEnv):
        @classmethod
        def make_tasks(cls, n, seed=0, split="train", **kwargs):
            return [{"id": str(i), "question": f"q{random.random()}"} for i in range(n)]

        @tool(inline=True)
        def ping(self) -> str:
            """Ping."""
            return "pong"

        def oracle_action(self) -> str:
            return "I give up."

    register_env("test/Flaky-v0", Flaky)
    report = check_tool_env("test/Flaky-v0")
    failed = {r.name for r in report.failures()}
    assert not report.ok
    assert {"scripted policy", "seeded determinism"} <= failed


@pytest.mark.timeout(180)
def test_cli_envs_and_check_env():
    toolrl = [sys.executable, "-m", "toolrl.cli"]
    listing = subprocess.run([*toolrl, "envs"], capture_output=True, text=True, timeout=150)
    assert listing.returncode == 0, listing.stderr
    for env_id in BUILTIN_ENVS:
        assert env_id in listing.stdout
    assert "add, sub, mul, div, pow, submit" in listing.stdout
    ok = subprocess.run([*toolrl, "check-env", "toolrl/Calculator-v0"], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0 and "PASS" in ok.stdout, ok.stdout + ok.stderr
    bad = subprocess.run([*toolrl, "check-env", "toolrl/Nope-v0"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1 and "toolrl/Calculator-v0" in bad.stdout


def _calculator() -> type:
    from toolrl.core.registration import make_env

    env = make_env("toolrl/Calculator-v0")
    try:
        return type(env.unwrapped)
    finally:
        env.close()


def test_check_env_flags_what_would_hurt_training():
    """Tools without type hints or docstrings, an evaluate that raises, an oracle whose episode
    never ends by itself: each a failed check that says what to change."""
    from toolrl import SubmitAnswer, ToolCall, Turn, register_env, submit_tool, tool

    class Undocumented(SubmitAnswer):
        @classmethod
        def make_tasks(cls, n, seed=0, split="train", **kwargs):
            return [{"id": f"u{seed}-{i}", "question": "Look up k."} for i in range(n)]

        @tool(inline=True)
        def lookup(self, key):  # no type hint, no docstring
            return "v"

        submit = submit_tool(str)

        def evaluate(self) -> bool:
            return self.submitted == "v"

        def oracle_action(self) -> str:
            call = ToolCall("lookup", {"key": "k"}) if self.turn == 0 else \
                ToolCall("submit", {"answer": "v"})
            return self.render_calls([call])

    class EvaluateRaises(_calculator()):
        def evaluate(self) -> bool:
            return self.row["no_such_field"] == 1

    class NeverEnds(_calculator()):
        def on_turn(self, parse, results):
            return Turn()

    register_env("test/Undocumented-v0", Undocumented)
    register_env("test/EvaluateRaises-v0", EvaluateRaises)
    register_env("test/NeverEnds-v0", NeverEnds)

    report = check_tool_env("test/Undocumented-v0")
    docs = next(r for r in report.results if r.name == "tool docs")
    assert not docs.ok and "lookup has no description" in docs.detail
    assert "lookup(key) has no type" in docs.detail
    assert {r.name for r in report.failures()} == {"tool docs"}, str(report)

    report = check_tool_env("test/EvaluateRaises-v0")
    evaluate = next(r for r in report.results if r.name == "evaluate")
    assert not evaluate.ok and "KeyError: 'no_such_field'" in evaluate.detail
    assert "in evaluate)" in evaluate.detail and "every episode" in evaluate.detail

    report = check_tool_env("test/NeverEnds-v0")
    policy = next(r for r in report.results if r.name == "scripted policy")
    assert not policy.ok and "did not end by itself" in policy.detail
    assert "Turn(terminated=True)" in policy.detail
    calc = check_tool_env("toolrl/Calculator-v0", max_turns=1)
    assert [r.name for r in calc.failures()] == ["scripted policy"]
    assert "needs 2 turns, more than the rollout's max_turns=1" in calc.failures()[0].detail


def test_check_env_prompt_budget(tiny_model_dir):
    def count(messages, tools):  # a stand-in tokenizer: one token per character
        return len(str(messages)) + len(str(tools))

    report = check_tool_env("toolrl/Calculator-v0", count_tokens=count, max_prompt_tokens=10**6)
    budget = next(r for r in report.results if r.name == "prompt budget")
    assert budget.ok and "of 1000000 tokens" in budget.detail
    report = check_tool_env("toolrl/Calculator-v0", count_tokens=count, max_prompt_tokens=50)
    budget = next(r for r in report.results if r.name == "prompt budget")
    assert not budget.ok and "8 of 8 task prompts" in budget.detail
    assert "max_prompt_tokens=50" in budget.detail

    toolrl = [sys.executable, "-m", "toolrl.cli", "check-env", "toolrl/Calculator-v0",
              "--model", str(tiny_model_dir)]
    ok = subprocess.run(toolrl, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "[ok] prompt budget" in ok.stdout, ok.stdout + ok.stderr
    over = subprocess.run([*toolrl, "--max-prompt-tokens", "100"], capture_output=True,
                          text=True, timeout=300)
    assert over.returncode == 1 and "[FAIL] prompt budget" in over.stdout, over.stdout
