"""Fault table, env failures at the rollout level: an env's reset raises, its step raises (on
the first or a later turn), its close raises, or it emits text the tokenizer rejects.

Expected: that episode is recorded with finish reason ``error`` (the message names the phase
and the exception), every other episode of the batch is untouched, and the batch has exactly
one output per input, in input order, with its uid (none lost, none duplicated).

The runner logic is checked with a scripted stand-in engine (fast); one test runs the same kind
of mixed batch, tool faults included, through the real `RolloutWorker` on the real vLLM CPU
engine with the tiny model (one engine for the module, shut down by the fixture).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from engine_checks import child_pids, left_running
from fault_harness import FAULT_ENV, assert_conserved, fault_row
from transformers import AutoTokenizer

from toolrl import batch as B
from toolrl.core.trajectory import Trajectory
from toolrl.rollout.chat import ChatRenderer
from toolrl.rollout.engine import Completion, EngineConfig, SamplingConfig
from toolrl.rollout.worker import RolloutConfig, RolloutWorker, make_rollout_input, resolve_runner

MAX_PROMPT, MAX_RESPONSE = 512, 512


class ScriptedEngine:
    """Stands in for `VLLMEngine` in runner-logic tests: every turn is the same short text."""

    def __init__(self, tokenizer, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.weight_version = 0
        self.ids = [*tokenizer.encode("next", add_special_tokens=False), tokenizer.eos_token_id]
        self.requests = 0

    async def generate(self, prompt_ids, sampling: SamplingConfig | None = None):
        self.requests += 1
        await asyncio.sleep(0)  # let other episodes interleave, as with the real engine
        n = min(len(self.ids), sampling.max_tokens if sampling else len(self.ids))
        return [Completion(self.ids[:n], [-0.25] * n, "stop" if n == len(self.ids) else "length")]

    def run_on_loop(self, coro):
        """No loop of its own: a rollout runs on a fresh one."""
        return asyncio.run(coro)


class ScriptedRolloutWorker(RolloutWorker):
    """`RolloutWorker` with `ScriptedEngine` in place of vLLM; everything else is the real one."""

    def __init__(self, config: RolloutConfig, tokenizer) -> None:
        self.config = config
        self.engine = ScriptedEngine(tokenizer, config.engine.max_model_len)
        self.renderer = ChatRenderer(tokenizer)
        self.runner = resolve_runner(config.runner)(self.engine, self.renderer,
                                                    config.episode_config())
        self.pad_token_id = tokenizer.pad_token_id
        self._calls = 0
        self._sync = None
        self._loaded_checksum = None
        self.agent = None  # no rollout.agent: the env path


def rollout_config(model: str, **changes) -> RolloutConfig:
    engine = EngineConfig(model=model, max_model_len=MAX_PROMPT + MAX_RESPONSE, kv_cache_gib=0.25,
                          gpu_memory_utilization=0.1, multiprocessing=False)
    base = dict(engine=engine, max_tokens_per_turn=8, max_prompt_tokens=MAX_PROMPT,
                max_total_tokens=MAX_PROMPT + MAX_RESPONSE, max_turns=32, env_id=FAULT_ENV,
                concurrency=4, seed=0,
                env_kwargs={"max_output_chars": 200, "tool_timeout": 0.3})
    return RolloutConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def scripted(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return ScriptedRolloutWorker(rollout_config(str(tiny_model_dir)), tokenizer)


def records_of(td, rows, n: int = 1) -> list[Trajectory]:
    """The batch's trajectories, after checking one output per input, in order."""
    records = B.trajectories(td)
    assert td.batch_size[0] == len(rows) * n == len(records)
    expected = [r["id"] for r in rows for _ in range(n)]
    assert_conserved(expected, [rec.id for rec in records])
    assert [rec.id for rec in records] == expected  # and in input order
    assert B.get_non_tensor(td, B.UID) == [rec.uid for rec in records]
    assert [row["id"] for row in B.get_non_tensor(td, B.ROWS)] == expected
    return records


def healthy(i: int) -> dict:
    return fault_row(f"ok-{i}", "echo", text="fine")


def assert_healthy(rec: Trajectory) -> None:
    assert rec.finish_reason == "terminated" and rec.success, rec.error
    assert rec.num_turns == 3 and rec.error is None


@pytest.mark.timeout(120)
def test_reset_raises_is_an_error_record_and_the_batch_goes_on(scripted):
    rows = [r for i in range(3) for r in (fault_row(f"reset-{i}", "echo", "reset", text="x"),
                                          healthy(i))]
    td = scripted.rollout(make_rollout_input(rows))
    records = records_of(td, rows)
    for i, rec in enumerate(records):
        if i % 2 == 0:
            assert rec.finish_reason == "error" and rec.num_turns == 0
            assert rec.error.startswith(
                f"reset: RuntimeError: injected reset failure in reset-{i // 2} (at ")
            assert td[B.RESPONSE_MASK][i].sum() == 0 and rec.response_tokens == 0
        else:
            assert_healthy(rec)
            assert td[B.RESPONSE_MASK][i].sum() > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fail_turn", [1, 2])
def test_step_raises_is_an_error_record_and_the_batch_goes_on(scripted, fail_turn):
    rows = [r for i in range(3) for r in (
        {**fault_row(f"step-{i}", "boom", "step"), "fail_turn": fail_turn}, healthy(i))]
    td = scripted.rollout(make_rollout_input(rows))
    records = records_of(td, rows)
    for i, rec in enumerate(records):
        if i % 2 == 0:
            assert rec.finish_reason == "error"
            assert rec.error.startswith(f"step: RuntimeError: injected step failure in "
                                        f"step-{i // 2} on turn {fail_turn} (at ")
            # the turns played before the failure keep their tokens (mask on sampled ones)
            assert rec.num_turns == fail_turn
            assert td[B.RESPONSE_MASK][i].sum() == fail_turn * len(scripted.engine.ids)
        else:
            assert_healthy(rec)


@pytest.mark.timeout(120)
def test_close_raises_keeps_the_finished_episode(scripted):
    rows = [r for i in range(3) for r in (fault_row(f"close-{i}", "echo", "close", text="x"),
                                          healthy(i))]
    td = scripted.rollout(make_rollout_input(rows))
    records = records_of(td, rows)
    for rec in records:
        assert rec.finish_reason == "terminated" and rec.error is None


@pytest.mark.timeout(120)
def test_text_the_tokenizer_rejects_is_an_error_record(scripted):
    """The env's own follow-up message holds a lone surrogate: that episode ends with
    ``error``; the batch goes on."""
    rows = [r for i in range(2) for r in (fault_row(f"text-{i}", "echo", "bad_text", text="x"),
                                          healthy(i))]
    td = scripted.rollout(make_rollout_input(rows))
    records = records_of(td, rows)
    for i, rec in enumerate(records):
        if i % 2 == 0:
            assert rec.finish_reason == "error" and rec.error.startswith("observation: ")
        else:
            assert_healthy(rec)


@pytest.mark.timeout(120)
def test_a_mixed_batch_of_env_faults_has_one_output_per_input(scripted):
    kinds = [("reset", {}), ("step", {}), ("close", {}), ("bad_text", {}), (None, {})]
    rows = [fault_row(f"mix-{j}-{fail}", "echo", fail, text="x", **args)
            for j in range(4) for fail, args in kinds]
    rows.insert(3, {"id": "no-such-env", "env": "toolrl-faults/NoSuchEnv-v0", "question": "q"})
    td = scripted.rollout(make_rollout_input(rows, n=2))
    records = records_of(td, rows, n=2)
    reasons = Counter(rec.finish_reason for rec in records)
    assert reasons == {"error": 2 * (3 * 4 + 1), "terminated": 2 * 2 * 4}
    uids = B.get_non_tensor(td, B.UID)
    assert all(count == 2 for count in Counter(uids).values())  # GRPO groups intact
    assert td[B.RESPONSES].shape == (len(rows) * 2, MAX_RESPONSE)


# --- the real engine -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_worker(tiny_model_dir):
    before = child_pids()
    worker = RolloutWorker(rollout_config(str(tiny_model_dir), concurrency=8))
    yield worker
    worker.shutdown()
    leftover = left_running(before)
    assert not leftover, f"engine processes left running: {leftover}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_real_rollout_worker_keeps_every_episode_through_tool_and_env_faults(vllm_worker):
    """Tool faults (raise, hang sync/async, 10 MB, not UTF-8, not printable) and env faults
    (reset, step, close, bad text) in one batch of GRPO groups on the real vLLM engine."""
    tool_faults = {"boom": ({}, "tool_exception"), "hang_sync": ({}, "timeout"),
                   "hang_async": ({}, "timeout"), "huge": ({"kind": "text"}, "output_truncated"),
                   "not_utf8": ({"kind": "surrogates"}, None),
                   "not_json": ({"kind": "huge_int"}, "tool_exception")}
    rows = [fault_row(f"tool-{name}", name, **args) for name, (args, _) in tool_faults.items()]
    rows += [fault_row(f"env-{fail}", "echo", fail, text="x")
             for fail in ("reset", "step", "close", "bad_text")]
    rows.append(healthy(0))
    td = vllm_worker.rollout(make_rollout_input(rows, n=2))
    records = records_of(td, rows, n=2)
    for rec in records:
        task = rec.id
        if task.startswith("tool-"):
            kind = tool_faults[task.removeprefix("tool-")][1]
            assert rec.finish_reason == "terminated" and rec.success, (task, rec.error)
            assert [e["type"] for e in rec.turns[0].errors] == ([kind] if kind else [])
            assert rec.turns[1].errors == []
        elif task in ("env-reset", "env-step", "env-bad_text"):
            assert rec.finish_reason == "error", task
        else:
            assert rec.finish_reason == "terminated" and rec.success, (task, rec.error)
    mask = td[B.RESPONSE_MASK]
    for i, rec in enumerate(records):
        assert int(mask[i].sum()) == rec.sampled_tokens
        sampled = sum(t.action_span[1] - t.action_span[0] for t in rec.turns)
        assert rec.sampled_tokens == sampled
    assert vllm_worker.check_health()
