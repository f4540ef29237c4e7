"""Fault table, infrastructure failures vs policy failures.

An episode fails for infrastructure reasons when a tool's server cannot be reached, the env
raises (make_env, reset, step), an env step runs past ``rollout.env_timeout_s`` or the episode
loop crashes; it fails by the policy when a call is bad or the answer wrong. The first kind is
recorded in ``Trajectory.infra_failure`` and `toolrl.trainer.failures.settle` keeps it out of
the batch the trainer scores and trains on (refilled, or dropped by sample or by group); too
many of them stop the run.

Runs through the real `RolloutWorker` with a scripted stand-in engine (fast); the trainer-level
path with the real engine and actor is in test_fault_trainer.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from fault_harness import FaultEnv, fault_row
from test_fault_episodes import ScriptedRolloutWorker, rollout_config
from transformers import AutoTokenizer

from toolrl import batch as B
from toolrl.core.registration import register_env
from toolrl.core.tools import tool
from toolrl.core.trajectory import Trajectory
from toolrl.rollout import loop_hold
from toolrl.rollout.episode import EpisodeRunner
from toolrl.rollout.worker import make_rollout_input
from toolrl.trainer.evaluate import result_tables, summarize
from toolrl.trainer.failures import InfraFailureConfig, InfraFailureError, settle

INFRA_ENV = "toolrl-faults/Infra-v0"


class InfraEnv(FaultEnv):
    """`FaultEnv` plus a tool whose server refuses connections and a step that hangs."""

    @tool
    def unreachable(self) -> str:
        """Its server is down."""
        raise ConnectionRefusedError(111, "Connection refused")

    async def astep(self, action: str) -> tuple:
        if (self.row or {}).get("fail") == "slow_step":
            await asyncio.sleep(30)
        return await super().astep(action)


register_env(INFRA_ENV, InfraEnv)
RELEASE = threading.Event()  # a blocking step waits for this (set once the rollout is back)


class BlockingEnv(FaultEnv):
    """A step that blocks its thread with sync code until released; it says so."""

    blocking_step = True

    async def astep(self, action: str) -> tuple:
        if (self.row or {}).get("fail") == "blocking_step":
            RELEASE.wait(60)
        return await super().astep(action)


class UndeclaredBlockingEnv(FaultEnv):
    """A step that blocks the event loop for 1.5 s (sync sleep) without saying so."""

    async def astep(self, action: str) -> tuple:
        if (self.row or {}).get("fail") == "blocking_step":
            time.sleep(1.5)
        return await super().astep(action)


register_env("toolrl-faults/Blocking-v0", BlockingEnv)
register_env("toolrl-faults/UndeclaredBlocking-v0", UndeclaredBlockingEnv)


class CrashingRunner(EpisodeRunner):
    """An episode loop with a bug on rows that ask for it."""

    async def generate_turn(self, state):
        if state.traj.row.get("fail") == "agent":
            raise KeyError("agent bug")
        return await super().generate_turn(state)


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = rollout_config(str(tiny_model_dir), env_id=INFRA_ENV, env_timeout_s=0.5,
                         runner=CrashingRunner)
    return ScriptedRolloutWorker(cfg, tokenizer)


def ok(i: int) -> dict:
    return fault_row(f"ok-{i}", "echo", text="fine")


ROWS = {
    "tool_unreachable": fault_row("down", "unreachable"),
    "env_exception": fault_row("reset", "echo", "reset", text="x"),
    "env_timeout": fault_row("slow", "echo", "slow_step", text="x"),
    "agent_crash": fault_row("agent", "echo", "agent", text="x"),
    "policy_bad_call": fault_row("bad-call", "no_such_tool"),
    "policy_tool_raised": fault_row("boom", "boom"),
    "make_env": {**ok(99), "id": "no-env", "env": "toolrl-faults/NoSuchEnv-v0"},
}


@pytest.mark.timeout(120)
def test_each_failure_is_classified_infra_or_policy(worker):
    rows = [*ROWS.values(), ok(0)]
    records = B.trajectories(worker.rollout(make_rollout_input(rows)))
    got = {rec.id: rec for rec in records}
    assert got["down"].infra_failure == "tool_unreachable"
    assert got["down"].errors[0]["infra"] is True  # the tool error says so too
    assert got["reset"].infra_failure == "env_exception"
    assert got["no-env"].infra_failure == "env_exception"
    assert got["slow"].infra_failure == "env_timeout"
    assert "env_timeout_s=0.5" in got["slow"].error
    assert got["agent"].infra_failure == "agent_crash"
    assert got["agent"].error == "agent: KeyError: 'agent bug'"
    # the policy's own failures stay policy failures
    for rid in ("bad-call", "boom", "ok-0"):
        assert got[rid].infra_failure is None, (rid, got[rid].errors)
    assert got["bad-call"].errors[0]["type"] == "unknown_tool"
    assert got["boom"].errors[0]["type"] == "tool_exception"
    # the field round-trips with the record
    assert Trajectory.from_dict(got["down"].to_dict()) == got["down"]


@pytest.mark.timeout(120)
def test_env_timeout_stops_a_step_that_blocks_its_thread(worker, caplog, monkeypatch):
    """An env that declares ``blocking_step`` steps on a daemon thread: its step blocks until
    the test releases it, which happens only after the rollout returned, so the rollout can
    only return because ``env_timeout_s`` (0.5 s) stopped the wait. An env that blocks the
    loop without declaring it is timed out when its step returns past the limit, and named
    in one warning with the fix (the loop-hold probe)."""
    monkeypatch.setattr(loop_hold, "_warned", set())
    blocking = {**fault_row("blocks", "echo", "blocking_step", text="x"),
                "env": "toolrl-faults/Blocking-v0"}
    undeclared = {**fault_row("undeclared", "echo", "blocking_step", text="x"),
                  "env": "toolrl-faults/UndeclaredBlocking-v0"}
    fine = {**ok(0), "env": "toolrl-faults/Blocking-v0"}
    try:
        with caplog.at_level(logging.WARNING, logger="toolrl.rollout.loop_hold"):
            got = {t.id: t for t in B.trajectories(worker.rollout(make_rollout_input(
                [blocking, undeclared, fine])))}
    finally:
        RELEASE.set()
    held = [r.getMessage() for r in caplog.records if r.name == "toolrl.rollout.loop_hold"]
    assert len(held) == 1 and "env UndeclaredBlockingEnv held the rollout's event loop" in \
        held[0] and "blocking_step = True" in held[0], held
    for rid in ("blocks", "undeclared"):
        assert got[rid].infra_failure == "env_timeout", (rid, got[rid].error)
        assert "env_timeout_s=0.5" in got[rid].error
    assert got["ok-0"].infra_failure is None and got["ok-0"].success


def _batch(worker, rows, n=2):
    return worker.rollout(make_rollout_input(rows, n=n))


@pytest.mark.timeout(120)
def test_drop_sample_and_drop_group_keep_infra_failures_out(worker):
    rows = [ok(0), fault_row("down", "unreachable"), ok(1), ok(2)]
    batch = _batch(worker, rows)  # 8 samples: 2 per task, both of "down" fail
    # one sample of ok-1's group fails too: an env that raised in only one of two samples
    trajs = B.trajectories(batch)
    trajs[4].infra_failure = "env_exception"
    B.set_non_tensor(batch, B.TRAJECTORIES, trajs)

    kept, metrics = settle(batch, InfraFailureConfig(rule="drop_sample"))
    assert [t.id for t in B.trajectories(kept)] == ["ok-0", "ok-0", "ok-1", "ok-2", "ok-2"]
    assert metrics["rollout/infra_failed"] == 3
    assert metrics["rollout/infra_failed/tool_unreachable"] == 2
    assert metrics["rollout/infra_failed/env_exception"] == 1
    assert metrics["rollout/infra_dropped"] == 3
    assert all(t.infra_failure is None for t in B.trajectories(kept))

    kept, metrics = settle(batch, InfraFailureConfig(rule="drop_group"))
    assert [t.id for t in B.trajectories(kept)] == ["ok-0", "ok-0", "ok-2", "ok-2"]
    assert metrics["rollout/infra_dropped"] == 4
    # tensors moved with their rows
    keep = [0, 1, 6, 7]
    assert (kept[B.RESPONSES] == batch[B.RESPONSES][keep]).all()


@pytest.mark.timeout(120)
def test_refill_reruns_failed_samples_in_place(worker):
    rows = [ok(0), fault_row("flaky", "unreachable"), ok(1)]
    batch = _batch(worker, rows)
    calls = []

    def rerun(rows, uids, attempt):  # the tool server is back for the second attempt
        calls.append((attempt, [r["id"] for r in rows]))
        fixed = [ok(9) | {"id": r["id"]} if attempt == 2 else r for r in rows]
        return worker.rollout(make_rollout_input(fixed, n=1, uids=uids))

    kept, metrics = settle(batch, InfraFailureConfig(rule="refill", refill_attempts=2,
                                                     max_fraction=0.5), rerun)
    assert calls == [(1, ["flaky", "flaky"]), (2, ["flaky", "flaky"])]
    trajs = B.trajectories(kept)
    assert [t.id for t in trajs] == ["ok-0", "ok-0", "flaky", "flaky", "ok-1", "ok-1"]
    assert all(t.infra_failure is None for t in trajs)
    uids = B.get_non_tensor(kept, B.UID)
    assert uids[2] == uids[3] == B.get_non_tensor(batch, B.UID)[2]  # same group
    assert metrics["rollout/infra_failed"] == 4  # 2 first, 2 on the first refill
    assert metrics["rollout/infra_refilled"] == 2 and metrics["rollout/infra_dropped"] == 0

    # refills that keep failing are dropped in the end
    kept, metrics = settle(batch, InfraFailureConfig(rule="refill", refill_attempts=1),
                           lambda rows, uids, attempt: worker.rollout(
                               make_rollout_input(rows, n=1, uids=uids)))
    assert [t.id for t in B.trajectories(kept)] == ["ok-0", "ok-0", "ok-1", "ok-1"]
    assert metrics["rollout/infra_dropped"] == 2


@pytest.mark.timeout(120)
def test_too_many_infra_failures_stop_the_run(worker):
    rows = [fault_row("down-a", "unreachable"), fault_row("down-b", "unreachable"), ok(0)]
    batch = _batch(worker, rows)
    with pytest.raises(InfraFailureError, match=r"4 of 6 episodes failed for infrastructure "
                                                r"reasons .*max_fraction=0.5"):
        settle(batch, InfraFailureConfig(max_fraction=0.5), lambda *a: pytest.fail("no refill"))
    kept, _ = settle(batch, InfraFailureConfig(rule="drop_sample", max_fraction=1.0))
    assert [t.id for t in B.trajectories(kept)] == ["ok-0", "ok-0"]
    everything = _batch(worker, [fault_row("down", "unreachable")])
    assert settle(everything, InfraFailureConfig(rule="drop_sample", max_fraction=1.0))[0] is None


@pytest.mark.timeout(120)
def test_eval_leaves_infra_failures_out_of_success(worker):
    """`toolrl eval`'s results (`summarize`): the episodes the infrastructure failed are
    counted (overall, per kind, per category) and scored nowhere, as in validation."""
    rows = [ok(0) | {"category": "a"}, ok(1) | {"category": "a"},
            fault_row("down", "unreachable") | {"category": "a"},
            fault_row("reset", "echo", "reset", text="x") | {"category": "b"},
            {"id": "wrong", "question": "q", "category": "b",  # a bad call, then an answer
             "calls": [[{"name": "no_such_tool", "arguments": {}}], []]}]
    trajs = B.trajectories(worker.rollout(make_rollout_input(rows)))
    # the env counts "down" as a success (its episode went on after the failed call): an
    # infrastructure failure is left out whatever the env made of it
    assert [t.success for t in trajs] == [True, True, True, False, False]
    results = summarize(trajs, [1.0, 1.0, 1.0, 0.0, 0.0], INFRA_ENV)
    assert results["num_tasks"] == 5 and results["infra_failed"] == 2
    assert results["infra_failed_by_kind"] == {"env_exception": 1, "tool_unreachable": 1}
    assert results["success"] == pytest.approx(2 / 3)  # the wrong answer is the policy's
    assert results["reward_mean"] == pytest.approx(2 / 3)
    assert results["per_category"] == {
        "a": {"n": 2, "success": 1.0, "reward_mean": 1.0, "infra_failed": 1},
        "b": {"n": 1, "success": 0.0, "reward_mean": 0.0, "infra_failed": 1}}
    everything = summarize(trajs[2:4], [0.0, 0.0], INFRA_ENV)  # nothing left to score
    assert everything["success"] is None and everything["infra_failed"] == 2
    [table] = result_tables(everything)
    assert table.row_count == 3  # categories a, b and "all", printed with "-"


@pytest.mark.timeout(120)
def test_an_http_service_that_is_down_is_an_infra_failure():
    """Connection refused is the service's failure: ``http_error`` with ``infra: true``, and
    the episode's ``infra_failure`` is ``tool_unreachable``; an HTTP 4xx stays the policy's."""
    from fault_harness import call, play_batch
    from test_fault_services import HTTP_ENV, http_rows
    from toolrl.envs.http_api.service import ThreadedServer

    from toolrl.core.registration import make_env

    server = ThreadedServer().start()
    url = server.url
    server.stop()  # nothing listens there any more
    rows = http_rows("down", n=2)
    script = [call("list_orders"), "Done."]
    episodes = asyncio.run(play_batch(lambda: make_env(HTTP_ENV, base_url=url, retries=0),
                                      rows, lambda env, m: script[env.unwrapped.turn]))
    for ep in episodes.values():
        (error,) = ep.turns[0].errors
        assert error["type"] == "http_error" and error["infra"] is True, error
        assert ep.infra_failure == "tool_unreachable"


@pytest.mark.timeout(120)
def test_an_mcp_server_killed_between_turns_is_an_infra_failure():
    """The MCP connection closed under the episode: ``tool_exception`` (``MCPError: Connection
    closed``) with ``infra: true``; the episode is ``tool_unreachable``."""
    import sys
    import uuid

    import psutil
    from fault_harness import call, play_batch
    from test_fault_services import FAULT_SERVER, MCP_ENV, MCP_ROW

    from toolrl.core.registration import make_env

    tag = uuid.uuid4().hex

    def policy(env, messages):
        if env.unwrapped.turn == 1:
            for proc in psutil.Process().children(recursive=True):
                try:  # another test's child that just ended (a zombie) has no command line
                    if tag in " ".join(proc.cmdline()):
                        proc.kill()
                except psutil.Error:
                    pass
        return [call("echo", text="hi"), call("echo", text="after"),
                call("submit", answer="x")][env.unwrapped.turn]

    episodes = asyncio.run(play_batch(
        lambda: make_env(MCP_ENV, command=[sys.executable, FAULT_SERVER, "--tag", tag],
                         tool_timeout=20), [dict(MCP_ROW, id="mcp-killed")], policy,
        timeout=90))
    ep = episodes["mcp-killed"]
    (error,) = ep.turns[1].errors
    assert error == {"type": "tool_exception", "tool": "echo",
                     "message": "MCPError: Connection closed", "infra": True}
    assert ep.infra_failure == "tool_unreachable" and not ep.turns[0].errors
