"""Multi-turn episodes and the rollout worker on the real vLLM CPU engine (one per module).

A random tiny model almost never writes a valid tool call, so multi-turn Calculator episodes
are driven by `OracleRunner`: an `EpisodeRunner` subclass that forces the env's scripted
oracle through the engine one allowed token at a time. Every token is still sampled by vLLM
and comes back with vLLM's log-prob, so the mask and log-prob invariants are checked on real
engine output.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import os
import threading
from pathlib import Path

import pytest
import torch
from engine_checks import child_pids, left_running
from toolrl.envs.calculator import CalculatorEnv
from transformers import AutoModelForCausalLM

from toolrl import batch as B
from toolrl.core.env import ToolEnv, Turn
from toolrl.core.parse import ToolCallFormat, get_format
from toolrl.core.registration import register_env
from toolrl.core.tools import tool
from toolrl.core.trajectory import Trajectory
from toolrl.core.types import ParseResult, ToolCall
from toolrl.reward import build_reward
from toolrl.rollout.engine import EngineConfig, SamplingConfig
from toolrl.rollout.episode import EpisodeConfig, EpisodeRunner, TurnOutput
from toolrl.rollout.worker import (
    RolloutConfig,
    RolloutWorker,
    make_rollout_input,
    rollout_metrics,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MAX_PROMPT, MAX_RESPONSE = 640, 384


class OracleRunner(EpisodeRunner):
    """Forces the env's scripted next message (and eos) through the engine token by token."""

    async def generate_turn(self, state):
        text = state.env.unwrapped.oracle_action()
        out = TurnOutput()
        for tok in [*self.renderer.encode(text), self.renderer.eos_token_id]:
            [c] = await self.engine.generate(
                state.token_ids + out.token_ids,
                self.turn_sampling(state, offset=len(out.token_ids), max_tokens=1,
                                   allowed_token_ids=(tok,)))
            out.add(c)
        return out


class EveryMessageCallsWait(ToolCallFormat):
    """Reads every assistant message as one call of ``wait`` (so a random model uses tools)."""

    name = "every-message-calls-wait"

    def _parse(self, text: str) -> ParseResult:
        return ParseResult(calls=[ToolCall("wait", {})], text=text)


class LatencyEnv(ToolEnv):
    """Each turn runs one real tool call that sleeps ``latency`` s; ends after ``turns`` turns.

    Class-level counters record how many calls were in flight at once across episodes.
    """

    inflight = 0
    max_inflight = 0

    def __init__(self, latency: float = 0.3, turns: int = 2, **kwargs):
        super().__init__(max_turns=turns + 1, **kwargs)
        self.parser = EveryMessageCallsWait()
        self.latency, self.turns = latency, turns

    @classmethod
    def make_tasks(cls, n, seed=0, split="train", **kwargs):
        return [{"id": f"lat-{seed}-{i}", "question": "Wait, then answer."} for i in range(n)]

    @tool
    async def wait(self) -> str:
        """Wait a while."""
        cls = type(self)
        cls.inflight += 1
        cls.max_inflight = max(cls.max_inflight, cls.inflight)
        try:
            await asyncio.sleep(self.latency)
        finally:
            cls.inflight -= 1
        return "waited"

    def on_turn(self, parse, results):
        return Turn(terminated=self.turn >= self.turns)

    def evaluate(self):
        return True


register_env("toolrl-test/Latency-v0", LatencyEnv)


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    """One rollout worker in this process; its engine runs vLLM's worker in-process."""
    config = RolloutConfig(
        engine=EngineConfig(model=str(tiny_model_dir), max_model_len=MAX_PROMPT + MAX_RESPONSE,
                            kv_cache_gib=0.25, multiprocessing=False),
        max_tokens_per_turn=24, max_prompt_tokens=MAX_PROMPT,
        max_total_tokens=MAX_PROMPT + MAX_RESPONSE, max_turns=32, env_id="toolrl/Calculator-v0",
        concurrency=16, seed=0)
    before = child_pids()
    w = RolloutWorker(config)
    default_runner = w.runner
    yield w
    w.runner = default_runner
    w.shutdown()
    leftover = left_running(before)
    assert not leftover, f"engine processes left running: {leftover}"


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture()
def runner_as(worker):
    """Swap the worker's episode runner for one test."""
    original = worker.runner

    def use(cls, **changes):
        cfg = worker.config.episode_config()
        for k, v in changes.items():
            setattr(cfg, k, v)
        worker.runner = cls(worker.engine, worker.renderer, cfg)
        return worker.runner

    yield use
    worker.runner = original


def sample(td, i: int) -> dict:
    """Unpadded tensors and the trajectory of sample ``i``."""
    rec = B.trajectories(td)[i]
    n = rec.response_tokens
    p_mask = td[B.ATTENTION_MASK][i, :MAX_PROMPT].bool()
    return {"rec": rec, "prompt": td[B.PROMPTS][i][p_mask].tolist(),
            "response": td[B.RESPONSES][i, :n].tolist(),
            "mask": td[B.RESPONSE_MASK][i, :n].tolist(),
            "logp": td[B.ROLLOUT_LOG_PROBS][i, :n]}


def assert_engine_logprobs_match_hf(hf, s: dict) -> None:
    ids = torch.tensor([s["prompt"] + s["response"]])
    with torch.no_grad():
        logits = hf(ids).logits[0].float()
    p = len(s["prompt"])
    logp = torch.log_softmax(logits[p - 1: -1], -1)
    hf_lp = logp[torch.arange(len(s["response"])), torch.tensor(s["response"])]
    m = torch.tensor(s["mask"]).bool()
    assert m.any()
    diff = (hf_lp[m] - s["logp"][m]).abs().max()
    assert diff < 1e-4, diff


def assert_mask_is_exactly_the_sampled_turns(s: dict) -> None:
    mask, rec = s["mask"], s["rec"]
    sampled = set()
    for t in rec.turns:
        sampled.update(range(*t.action_span))
    assert {j for j, m in enumerate(mask) if m} == sampled
    assert all(s["logp"][j] == 0.0 for j, m in enumerate(mask) if not m)
    assert all(s["logp"][j] < 0.0 for j, m in enumerate(mask) if m)


def test_multi_turn_calculator_masks_log_probs_and_tokens(worker, hf, runner_as):
    runner_as(OracleRunner)
    rows = CalculatorEnv.make_tasks(3, seed=1, difficulty=2)
    td = worker.rollout(make_rollout_input(rows))
    assert td[B.PROMPTS].shape == (3, MAX_PROMPT)
    assert td[B.RESPONSES].shape == td[B.ROLLOUT_LOG_PROBS].shape == (3, MAX_RESPONSE)
    tok = worker.engine.tokenizer
    for i in range(3):
        s = sample(td, i)
        rec = s["rec"]
        assert rec.finish_reason == "terminated" and rec.success is True
        assert rec.num_turns == 3 and [t.env_reward for t in rec.turns] == [0.0, 0.0, 1.0]
        assert [c.name for c in rec.calls] == [op for op, _, _ in rows[i]["plan"]] + ["submit"]
        assert [r.name for t in rec.turns for r in t.results] == [c.name for c in rec.calls]
        assert rec.tokens is None  # the batch holds the tokens; the spans index its rows
        assert_mask_is_exactly_the_sampled_turns(s)
        # every tool-result token has mask 0, and the tool results are really there
        results = [m for m in rec.messages if m["role"] == "tool"]
        for t, result, (op, _, _) in zip(rec.turns, results, rows[i]["plan"], strict=False):
            obs = s["response"][slice(*t.observation_span)]
            assert set(s["mask"][slice(*t.observation_span)]) == {0}
            assert result["name"] == op
            assert f"<tool_response>{result['content']}</tool_response>" in tok.decode(obs)
        # token-in/token-out: the same ids as one render of the conversation up to the last
        # model turn (the final tool result is in the messages, not in the tokens)
        last = max(j for j, m in enumerate(rec.messages) if m["role"] == "assistant")
        assert rec.messages[last + 1:] == [
            {"role": "tool", "name": "submit", "content": "submitted"}]
        full = tok.apply_chat_template(rec.messages[: last + 1], tools=rec.tools,
                                       return_dict=False)
        ids = s["prompt"] + s["response"]
        assert full[: len(ids)] == ids and tok.decode(full[len(ids):]) == "\n"
        assert_engine_logprobs_match_hf(hf, s)
    for t in B.trajectories(td):  # records are plain JSON, and come back equal
        assert Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_each_action_is_parsed_once_per_turn(worker, runner_as, monkeypatch):
    """A 3-turn episode, then every reward that reads calls: three parses in all, the env's."""
    calls = []
    parse = ToolCallFormat.parse

    def counted(self, text):
        calls.append(text)
        return parse(self, text)

    monkeypatch.setattr(ToolCallFormat, "parse", counted)
    runner = runner_as(OracleRunner)
    row = CalculatorEnv.make_tasks(1, seed=1, difficulty=2)[0]
    env = worker.make_env(row)
    traj = asyncio.run(runner.run(env, row, seed=0))
    env.close()
    assert traj.num_turns == 3 and traj.success
    assert calls == [t.action for t in traj.turns]
    with build_reward(["format", "answer_match", "success", "tool_error_penalty",
                       "turn_penalty"]) as fn:
        out = fn.score([traj])
    assert out.components["format"] == out.components["answer_match"] == [1.0]
    assert calls == [t.action for t in traj.turns]  # the rewards parsed nothing again


def test_free_sampling_groups(worker, hf):
    rows = CalculatorEnv.make_tasks(2, seed=2)
    td = worker.rollout(make_rollout_input(rows, n=3))
    uids = B.get_non_tensor(td, B.UID)
    assert uids == [rows[0]["id"]] * 3 + [rows[1]["id"]] * 3
    responses = []
    for i in range(6):
        s = sample(td, i)
        assert s["rec"].finish_reason in ("terminated", "truncated", "length")
        assert_mask_is_exactly_the_sampled_turns(s)
        assert_engine_logprobs_match_hf(hf, s)
        responses.append(tuple(s["response"]))
    assert len(set(responses[:3])) == 3  # samples of one group differ (per-episode seeds)
    assert td[B.POLICY_VERSION].tolist() == [worker.engine.weight_version] * 6
    metrics = rollout_metrics(td)
    records = B.trajectories(td)
    assert metrics["rollout/sampled_tokens"] == td[B.RESPONSE_MASK].sum().item()
    assert metrics["rollout/turns_mean"] == sum(r.num_turns for r in records) / 6
    assert metrics["rollout/dropped_calls_mean"] == sum(r.dropped_calls for r in records) / 6
    assert sum(v for k, v in metrics.items() if k.startswith("rollout/finish_")) == \
        pytest.approx(1.0)
    # prompts are left-padded, responses right-padded
    attn = td[B.ATTENTION_MASK][0]
    assert attn[0] == 0 and attn[MAX_PROMPT - 1] == 1 and attn[-1] == 0


def test_response_budget_ends_a_turn_with_length(worker):
    runner = EpisodeRunner(worker.engine, worker.renderer,
                           EpisodeConfig(sampling=SamplingConfig(max_tokens=50, ignore_eos=True),
                                         max_response_len=10))
    env = worker.make_env({"env": "toolrl/Calculator-v0"})
    result = asyncio.run(runner.run(env, CalculatorEnv.make_tasks(1, seed=3)[0], seed=1))
    assert result.finish_reason == "length" and result.num_turns == 1
    assert len(result.tokens.response_ids) == 10 and result.tokens.response_mask == [1] * 10
    # the env never saw the cut turn; the runner parsed it once, with the env's format
    turn = result.turns[0]
    assert turn.parse == get_format("hermes").parse(turn.action) and turn.results == []


@pytest.mark.parametrize("overflow", ["stop", "truncate"])
def test_an_observation_that_does_not_fit_ends_with_context(worker, runner_as, overflow):
    row = CalculatorEnv.make_tasks(1, seed=4, difficulty=2)[0]
    op, a, b = row["plan"][0]
    first_call = get_format("hermes").render([ToolCall(op, {"a": a, "b": b})])
    first_turn = len(worker.renderer.encode(first_call)) + 1
    runner = runner_as(OracleRunner, max_response_len=first_turn + 5, on_overflow=overflow)
    env = worker.make_env(row)
    result = asyncio.run(runner.run(env, row, seed=0))
    assert result.finish_reason == "context" and result.num_turns == 1
    expected = first_turn if overflow == "stop" else first_turn + 5
    assert len(result.tokens.response_ids) == expected
    assert result.tokens.response_mask == [1] * first_turn + [0] * (expected - first_turn)
    span = result.turns[0].observation_span
    assert span == (None if overflow == "stop" else (first_turn, expected))


def test_bad_rows_become_error_records_and_the_batch_goes_on(worker):
    good = CalculatorEnv.make_tasks(1, seed=5)[0]
    no_truth = {"id": "bad", "question": "What is 1 plus 1?"}
    unknown_env = {"id": "nowhere", "env": "toolrl/NoSuchEnv-v0", "question": "hi"}
    td = worker.rollout(make_rollout_input([good, no_truth, unknown_env]))
    recs = B.trajectories(td)
    assert recs[0].finish_reason != "error"
    assert recs[1].finish_reason == "error" and "ground_truth" in recs[1].error
    assert recs[2].finish_reason == "error" and "NoSuchEnv" in recs[2].error
    assert [r.row for r in recs] == [good, no_truth, unknown_env]
    assert td[B.RESPONSE_MASK][1:].sum() == 0


def test_episodes_overlap_while_tools_wait(worker):
    rows = [dict(r, env="toolrl-test/Latency-v0") for r in LatencyEnv.make_tasks(8)]
    LatencyEnv.max_inflight = 0
    td = worker.rollout(make_rollout_input(rows))
    recs = B.trajectories(td)
    assert all(r.num_turns == 2 and r.finish_reason == "terminated" for r in recs)
    assert all(out.latency >= 0.3 for r in recs for t in r.turns for out in t.results)
    assert LatencyEnv.max_inflight > 1  # one episode's tool wait did not block the others
    worker.config.concurrency = 1
    try:
        LatencyEnv.max_inflight = 0
        worker.rollout(make_rollout_input(rows[:3]))
        assert LatencyEnv.max_inflight == 1
    finally:
        worker.config.concurrency = 16


def test_the_worker_freezes_the_startup_heap_out_of_the_collector(worker):
    # vLLM, torch and transformers leave ~1M long-lived objects; a full collection over them
    # paused a rollout for ~0.4 s, so the worker freezes them once its engine is up
    frozen = gc.get_freeze_count()
    assert frozen > 100_000
    worker.rollout(make_rollout_input(CalculatorEnv.make_tasks(4, seed=5)))
    gc.collect()  # what a full collection still walks after a rollout: a fraction of the heap
    assert len(gc.get_objects()) < frozen / 2


def test_the_engine_core_leaves_a_cpu_to_the_episodes(worker):
    # torch threads on every core waited at each barrier of the forward pass for the episodes'
    # own Python work; the engine core gets one CPU fewer than this process may use
    want = worker.engine.config.cpu_threads
    assert want == max(1, len(os.sched_getaffinity(0)) - 1)
    # what the forward pass runs on, asked of the engine's worker (inside the core here)
    assert asyncio.run(worker.engine.collective_rpc("toolrl_torch_threads")) == [want]


def test_episodes_run_on_the_engine_loop_and_leave_no_task_behind(worker):
    seen = {}

    async def episodes_and_a_stray_task():
        seen["thread"] = threading.current_thread().name
        seen["stray"] = asyncio.ensure_future(asyncio.sleep(3600))
        return await worker.run_episodes(CalculatorEnv.make_tasks(2, seed=9), [1, 2])

    trajs = worker.engine.run_on_loop(episodes_and_a_stray_task())
    assert [t.infra_failure for t in trajs] == [None, None] and trajs[0].sampled_tokens > 0
    assert seen["thread"] == "toolrl-vllm-engine"  # no hop between threads per model call
    assert seen["stray"].cancelled()  # as asyncio.run would
    assert worker.engine.is_healthy()

    async def nested():
        worker.engine.run_on_loop(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="blocks"):
        worker.engine.run_on_loop(nested())


def test_load_weights_bumps_the_policy_version(worker, hf):
    version = worker.load_weights(hf.state_dict())
    assert version == worker.policy_version() == worker.engine.weight_version
    td = worker.rollout(make_rollout_input(CalculatorEnv.make_tasks(1, seed=6)))
    assert td[B.POLICY_VERSION].tolist() == [version]
    assert B.trajectories(td)[0].policy_version == version
    assert worker.check_health()


def load_example():
    path = ROOT / "examples" / "two_stage_rollout" / "two_stage.py"
    spec = importlib.util.spec_from_file_location("two_stage_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_stage_example_think_then_call(worker, hf, runner_as):
    runner = runner_as(load_example().TwoStageRunner, max_turns=2,
                       sampling=SamplingConfig(max_tokens=64))
    tok = worker.engine.tokenizer
    td = worker.rollout(make_rollout_input(CalculatorEnv.make_tasks(2, seed=7)))
    think_open = runner.renderer.encode(runner.think_open)
    transition = runner.renderer.encode(runner.transition)
    for i in range(2):
        s = sample(td, i)
        assert_engine_logprobs_match_hf(hf, s)
        assert all(s["logp"][j] == 0.0 for j, m in enumerate(s["mask"]) if not m)
        for t in s["rec"].turns:
            ids = s["response"][slice(*t.action_span)]
            mask = s["mask"][slice(*t.action_span)]
            runs = [(m, j) for j, m in enumerate(mask) if j == 0 or mask[j - 1] != m]
            # inserted <think> | sampled thought | inserted (</think>) + prefix | sampled call
            assert [m for m, _ in runs] == [0, 1, 0, 1]
            (_, a), (_, b), (_, c), (_, d) = runs
            assert ids[a:b] == think_open
            assert ids[c:d][-len(transition):] == transition
            assert tok.decode(ids[:d]).endswith("</think>\n<tool_call>")
            assert t.action.startswith("<think>")
