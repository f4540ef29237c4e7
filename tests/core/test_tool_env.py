"""ToolEnv: episode mechanics, typed error observations, concurrency, wrappers, registration."""

from __future__ import annotations

import asyncio
import json
import warnings
from typing import Any

import gymnasium as gym
import pytest

from toolrl.core.env import ToolEnv, Turn, resolve_astep, run_episode
from toolrl.core.registration import env_ids, make_env, register_env
from toolrl.core.tools import tool
from toolrl.core.types import ERROR_TYPES, ToolCall
from toolrl.core.wrappers import MaxTurns, ObservationBudget, ToolTimeout, ToolWrapper
from toolrl.registry import RegistryError


class ProbeEnv(ToolEnv):
    """A test env whose tools misbehave on purpose."""

    system_prompt = "probe"
    default_max_turns = 5
    default_tool_timeout = 5.0

    def setup(self, row: dict[str, Any]) -> None:
        self.log: list[str] = []
        self.partner = asyncio.Event()
        self.answer: str | None = None

    @classmethod
    def make_tasks(cls, n, seed=0, split="train", **kwargs):
        return [{"id": f"p{seed}-{i}", "question": f"say {seed + i}",
                 "ground_truth": str(seed + i)} for i in range(n)]

    @tool(inline=True)
    def echo(self, text: str) -> str:
        """Echo.

        Args:
            text: what to echo
        """
        self.log.append(text)
        return text

    @tool
    async def slow(self, seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long
        """
        await asyncio.sleep(seconds)
        return "slept"

    @tool(inline=True)
    def boom(self) -> str:
        """Fail."""
        raise KeyError("no such record")

    @tool(inline=True)
    def big(self, n: int) -> str:
        """Big output.

        Args:
            n: characters
        """
        return "y" * n

    @tool
    async def wait_partner(self) -> str:
        """Wait until set_partner runs in the same turn."""
        await asyncio.wait_for(self.partner.wait(), 5)
        return "met"

    @tool
    async def set_partner(self) -> str:
        """Release wait_partner."""
        self.partner.set()
        return "set"

    @tool(inline=True)
    def answer(self, value: str) -> str:
        """Final answer.

        Args:
            value: the answer
        """
        self.answer = value
        return "ok"

    def on_turn(self, parse, results) -> Turn:
        done = any(c.name == "answer" for c in parse.calls) or not (parse.calls or parse.errors)
        return Turn(terminated=done, reward=-0.1 * sum(not r.ok for r in results))

    def evaluate(self) -> bool:
        return self.answer == self.row["ground_truth"]

    def state_snapshot(self) -> dict[str, Any]:
        return {"log": list(self.log), "answer": self.answer}

    def oracle_action(self) -> str:
        return self.render_calls([ToolCall("answer", {"value": self.row["ground_truth"]})])


register_env("test/Probe-v0", ProbeEnv)


def call(name: str, **arguments: Any) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.fixture
def env():
    e = make_env("test/Probe-v0")
    e.reset(options={"id": "t", "question": "say 7", "ground_truth": "7"})
    yield e
    e.close()


def step(env, action):
    return asyncio.run(env.astep(action))


def test_reset_returns_messages_tools_and_format():
    e = make_env("test/Probe-v0")
    obs, info = e.reset(seed=3)
    assert obs[0] == {"role": "system", "content": "probe"}
    assert obs[1]["role"] == "user" and obs[1]["content"].startswith("say ")
    assert obs in e.observation_space
    names = [t["function"]["name"] for t in info["tools"]]
    assert names == ["echo", "slow", "boom", "big", "wait_partner", "set_partner", "answer"]
    assert info["format"] == "hermes"
    info["tools"][0]["function"]["name"] = "mutated"
    assert e.unwrapped.tools_schema()[0]["function"]["name"] == "echo"  # fresh copies
    e.close()


def test_each_bad_call_gets_a_typed_observation_and_the_episode_continues(env):
    cases = [
        ('<tool_call>{"name": "echo", "arguments": {"text": </tool_call>', "parse_error"),
        ('<tool_call>{"name": "echo", "arguments": {"text": "a"}}', "parse_error"),
        (call("echo"), "missing_required"),
        (call("echo", text=5), "wrong_type"),
        (call("echo", text="a", loud=True), "unknown_param"),
        (call("nope"), "unknown_tool"),
        (call("boom"), "tool_exception"),
        (call("big", n=10**6), "output_truncated"),
    ]
    e = make_env("test/Probe-v0", max_turns=20)
    e.reset(options={"id": "t", "question": "q", "ground_truth": "7"})
    for action, kind in cases:
        obs, reward, terminated, truncated, info = step(e, action)
        assert not terminated and not truncated, kind
        assert [err["type"] for err in info["errors"]] == [kind]
        assert kind in ERROR_TYPES
        assert len(obs) == 1 and obs[0]["role"] == "tool"
        if kind == "output_truncated":
            assert obs[0]["content"].endswith("...[truncated 998000 chars]")
        else:
            assert json.loads(obs[0]["content"])["error"] == kind
            assert len(obs[0]["content"]) < 400
    _, reward, terminated, _, info = step(e, call("answer", value="7"))
    assert terminated and info["success"] and reward == 1.0
    e.close()


def test_exception_observation_names_the_type(env):
    obs, *_ = step(env, call("boom"))
    assert json.loads(obs[0]["content"]) == {"error": "tool_exception", "tool": "boom",
                                             "message": "KeyError: 'no such record'"}


def test_timeout_is_an_observation_and_the_episode_continues():
    e = make_env("test/Probe-v0", tool_timeout=0.2)
    e.reset(seed=0)
    obs, _, terminated, _, info = step(e, call("slow", seconds=30))
    assert info["errors"][0]["type"] == "timeout" and not terminated
    assert json.loads(obs[0]["content"])["error"] == "timeout"
    _, _, terminated, _, _ = step(e, call("slow", seconds=0.01))
    assert not terminated
    e.close()


def test_parallel_calls_run_concurrently_and_return_in_call_order(env):
    # wait_partner only returns once set_partner ran: sequential execution would time out.
    action = call("wait_partner") + call("echo", text="mid") + call("set_partner")
    obs, _, _, _, info = step(env, action)
    assert [m["name"] for m in obs] == ["wait_partner", "echo", "set_partner"]
    assert [m["content"] for m in obs] == ["met", "mid", "set"]
    assert info["errors"] == [] and len(info["latencies"]) == 3
    assert [c.name for c in info["calls"]] == ["wait_partner", "echo", "set_partner"]
    assert info["turn_reward"] == 0.0


def test_final_text_ends_the_episode_and_max_turns_truncates():
    e = make_env("test/Probe-v0")
    e.reset(options={"id": "t", "question": "q", "ground_truth": "7"})
    obs, reward, terminated, truncated, info = e.step("The answer is 7.")  # sync shim
    assert terminated and not truncated and obs == [] and info["success"] is False
    with pytest.raises(gym.error.ResetNeeded):
        e.step("again")
    e.close()

    short = make_env("test/Probe-v0", max_turns=2)
    short.reset(options={"id": "t", "question": "q", "ground_truth": "7"})
    assert not step(short, call("echo", text="1"))[3]
    _, reward, terminated, truncated, info = step(short, call("echo", text="2"))
    assert truncated and not terminated
    assert info["success"] is False and info["end_reason"] == "max_turns" and reward == 0.0
    short.close()


def test_step_before_reset_is_refused():
    e = ProbeEnv()
    with pytest.raises(gym.error.ResetNeeded):
        e.step("hi")


def test_astep_is_reachable_through_gymnasium_make():
    raw = gym.make("test/Probe-v0")  # OrderEnforcing(PassiveEnvChecker(ProbeEnv))
    assert not hasattr(raw, "astep")
    raw.reset(options={"id": "t", "question": "q", "ground_truth": "7"})
    obs, *_ = asyncio.run(resolve_astep(raw)(call("echo", text="hi")))
    assert obs[0]["content"] == "hi"
    wrapped = make_env("test/Probe-v0")
    assert isinstance(wrapped, ToolWrapper) and isinstance(wrapped.unwrapped, ProbeEnv)
    raw.close()
    wrapped.close()


def test_wrappers():
    base = MaxTurns(gym.make("test/Probe-v0"), 1)
    base.reset(seed=1)
    _, _, _, truncated, info = step(base, call("echo", text="x"))
    assert truncated and "success" in info
    base.close()

    timed = ToolTimeout(gym.make("test/Probe-v0"), 0.1)
    timed.reset(seed=1)
    assert step(timed, call("slow", seconds=10))[4]["errors"][0]["type"] == "timeout"
    timed.close()

    budget = ObservationBudget(gym.make("test/Probe-v0"), 50)
    budget.reset(seed=1)
    obs, _, _, _, info = step(budget, call("big", n=500))
    assert obs[0]["content"] == "y" * 50 + "...[truncated 450 chars]"
    assert info["errors"][-1]["type"] == "output_truncated"
    budget.close()

    class Words:  # a stand-in tokenizer: one token per character pair
        def encode(self, text, add_special_tokens=False):
            return [text[i:i + 2] for i in range(0, len(text), 2)]

        def decode(self, ids):
            return "".join(ids)

    tokens = make_env("test/Probe-v0", observation_budget=10, tokenizer=Words())
    tokens.reset(seed=1)
    obs, *_ = step(tokens, call("big", n=100))
    assert obs[0]["content"] == "y" * 20 + "...[truncated 40 tokens]"
    tokens.close()


def test_registration_is_idempotent_and_loud():
    register_env("test/Probe-v0", ProbeEnv)  # same entry point again: fine
    with pytest.raises(RegistryError, match="already registered"):
        register_env("test/Probe-v0", "somewhere.else:Env")
    with pytest.raises(RegistryError, match="toolrl/Calculator-v0"):
        make_env("test/Missing-v0")
    assert "toolrl/Calculator-v0" in env_ids() and "test/Probe-v0" in env_ids()


def test_gymnasium_check_env_passes_without_warnings():
    from gymnasium.utils.env_checker import check_env

    e = make_env("test/Probe-v0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(e.unwrapped)
    e.close()


def test_run_episode_with_async_policy_and_isolation():
    async def policy(env, messages):
        await asyncio.sleep(0)
        return call("echo", text=messages[1]["content"]) if env.unwrapped.turn == 0 \
            else env.unwrapped.oracle_action()

    async def many():
        envs = [make_env("test/Probe-v0") for _ in range(8)]
        rows = ProbeEnv.make_tasks(8, seed=10)
        eps = await asyncio.gather(*(run_episode(e, policy, row=r) for e, r in zip(envs, rows,
                                                                                     strict=True)))
        for e in envs:
            e.close()
        return rows, eps

    rows, eps = asyncio.run(many())
    for row, ep in zip(rows, eps, strict=True):
        assert ep.success and ep.env_reward == 1.0
        assert ep.final_state == {"log": [row["question"]], "answer": row["ground_truth"]}
