"""Async mode (``trainer.mode: async``) on the real stack: Ray, a vLLM CPU engine on its own
pool streaming groups, FSDP2 on gloo, weights pushed over a gloo broadcast group while the
engine generates."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from trainer_runs import register_test_rewards, small_run_overrides, wait_gone

from toolrl.rollout.worker import RolloutWorker
from toolrl.trainer.async_mode import AsyncSchedule
from toolrl.trainer.config import ConfigError, load_config, to_dict
from toolrl.trainer.failures import RolloutFailedError
from toolrl.trainer.run import run_training
from toolrl.trainer.tracking import read_metrics
from toolrl.trainer.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "quickstart_async.yaml"
BATCH, GROUP = 2, 4  # tasks per step, samples per task (small_run_overrides)


def overrides(model: Path, out: Path, **extra: object) -> list[str]:
    register_test_rewards()
    return small_run_overrides(model, out, **{
        "actor.weight_bucket_mb": 0.5, "rollout.engine.kv_cache_gib": 0.25,
        "trainer.log_rollouts": BATCH * GROUP, "trainer.call_timeout_s": 300,
        "trainer.export_hf": False, "reward": "{rewards: [{name: test_digit_fraction}]}",
        **extra})


# --- config ------------------------------------------------------------------------------------
def test_the_async_quickstart_is_the_pipeline_quickstart_in_async_mode():
    pipe = to_dict(load_config(ROOT / "configs" / "quickstart_pipeline.yaml"))
    asyn = to_dict(load_config(CONFIG))
    assert asyn["trainer"].pop("mode") == "async" and pipe["trainer"].pop("mode") == "pipeline"
    assert asyn["trainer"]["max_staleness"] == 2 and asyn["trainer"]["stale_policy"] == \
        "continue"
    for cfg in (asyn, pipe):
        cfg.pop("experiment_name")
        cfg["trainer"].pop("max_staleness")
        cfg["trainer"].pop("stale_policy")
    assert asyn == pipe


@pytest.mark.parametrize(("extra", "message"), [
    ({"trainer.max_staleness": 3}, "applies to trainer.mode=async only"),
    ({"trainer.stale_policy": "drop"}, "applies to trainer.mode=async only"),
    ({"trainer.mode": "async", "trainer.max_staleness": -1}, "must be an integer >= 0"),
    ({"trainer.mode": "async", "trainer.stale_policy": "wait"}, "stale_policy"),
])
def test_async_keys_are_checked(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        load_config(ROOT / "configs" / "quickstart.yaml", overrides(tmp_path, tmp_path, **extra))


# --- end to end --------------------------------------------------------------------------------
def dumped(out: Path, step: int) -> list[dict]:
    path = out / "rollouts" / f"step_{step}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_async_trains_within_the_staleness_bound_and_counts_every_group(
        ray_cluster, tiny_model_dir, tmp_path):
    out, steps, k = tmp_path / "run", 5, 2
    over = overrides(tiny_model_dir, out, **{
        "trainer.total_steps": steps, "trainer.max_staleness": k, "actor.lr": 1e-3,
        "rollout.max_turns": 3, "trainer.save_every": 3})
    trainer = Trainer(load_config(CONFIG, over))
    try:
        trainer.fit()
        rows = read_metrics(out / "metrics.jsonl")
        assert [r["step"] for r in rows] == list(range(steps + 1))
        seen: set[str] = set()
        for r in rows[1:]:
            s = r["step"]
            assert r["policy_version"] == s
            assert 0 <= r["async/staleness_mean"] <= r["async/staleness_max"] <= k
            # per trained token (a partial rollout's new tokens are less stale than its group)
            assert 0 <= r["async/token_staleness_mean"] <= r["async/token_staleness_max"] \
                <= r["async/staleness_max"]
            assert sum(r[f"async/token_lag_{j}"] for j in range(k + 1)) == pytest.approx(1.0)
            # counted in and out: trained so far, the rest dropped or still out there
            assert r["async/trained"] == s * BATCH
            assert r["async/submitted"] == r["async/trained"] + r["async/dropped_stale"] + \
                r["async/in_flight"] + r["async/buffer_size"]
            assert r["async/dropped_stale"] == 0  # stale_policy=continue drops nothing
            assert r["async/push_pause_s"] > 0
            assert r["sync/probe_max_abs_diff"] < 1e-3  # the engine holds the actor's weights
            samples = dumped(out, s)
            assert len(samples) == BATCH * GROUP
            # each sample's version: the weights its group started on (step s trains at s - 1)
            assert all(0 <= s - 1 - d["policy_version"] <= k for d in samples)
            uids = {d["uid"] for d in samples}
            assert len(uids) == BATCH and not uids & seen  # whole groups, none trained twice
            seen |= uids
        assert max(r["async/staleness_max"] for r in rows[1:]) >= 1  # it did run ahead
        assert min(r["async/token_lag_0"] for r in rows[1:]) < 1  # stale tokens trained
        assert trainer.schedule.buffer is not None
        trainer.schedule.buffer.check()
    finally:
        trainer.close()

    # resumed from the checkpoint at step 3: the groups outstanding there are generated again
    # first (their staleness clock restarting), then the stream goes on from the loader's
    # position; steps 4 and 5 train none of steps 1-3's groups again, and no row is lost
    from toolrl.trainer.checkpoint import load_trainer_state

    before = {d["uid"] for s in (1, 2, 3) for d in dumped(out, s)}
    state = load_trainer_state(out / "checkpoints" / "step_3", restore_rng=False)
    outstanding = [job["uid"] for job in state["async_outstanding"]]
    assert outstanding and not set(outstanding) & before  # it ran ahead of step 3
    resumed = Trainer(load_config(CONFIG, over))
    try:
        resumed.fit()
    finally:
        resumed.close()
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(steps + 1))
    assert rows[4]["async/trained"] == BATCH and rows[4]["async/staleness_max"] == 0
    after = {d["uid"] for s in (4, 5) for d in dumped(out, s)}
    assert len(after) == 2 * BATCH and not after & before
    # every group outstanding at the checkpoint is trained after the resume or still out there
    # at the end: none skipped
    buffer = resumed.schedule.buffer
    still = set(buffer.outstanding) if buffer is not None else set()
    assert set(outstanding) <= after | still


def test_a_rollout_worker_killed_mid_stream_is_restarted_and_nothing_is_lost(
        ray_cluster, tiny_model_dir, tmp_path, monkeypatch):
    """``on_rollout_failure: retry``: the rollout pool is restarted, the groups it had in
    flight are generated again, the run finishes; with ``stop`` the run stops naming the
    worker."""
    out = tmp_path / "retry"
    cfg = load_config(CONFIG, overrides(tiny_model_dir, out, **{
        "trainer.total_steps": 3, "trainer.on_rollout_failure": "retry",
        "trainer.max_staleness": 1}))
    take = AsyncSchedule.take_batch
    killed: list[int] = []

    engines: list[int] = []

    def kill_at_step_2(self: AsyncSchedule):
        if self.t.step == 1 and not killed:
            rollout = self.t.handles["rollout"]
            engines.extend(rollout.call(RolloutWorker.engine_pids)[0])
            killed.append(rollout.group.pids[0])
            os.kill(killed[0], signal.SIGKILL)
        return take(self)

    monkeypatch.setattr(AsyncSchedule, "take_batch", kill_at_step_2)
    trainer = Trainer(cfg)
    try:
        trainer.fit()
        assert killed and killed[0] not in trainer.handles["rollout"].group.pids
        rows = read_metrics(out / "metrics.jsonl")
        assert [r["step"] for r in rows] == [0, 1, 2, 3]
        assert rows[-1]["trainer/rollout_retries"] == 1
        assert rows[-1]["async/trained"] == 3 * BATCH
        trainer.schedule.buffer.check()
        uids = [d["uid"] for s in (1, 2, 3) for d in dumped(out, s)]
        assert len(set(uids)) == 3 * BATCH  # none trained twice
        assert all(r["async/staleness_max"] <= 1 for r in rows[1:])
    finally:
        trainer.close()
        leftovers = wait_gone(engines, timeout=60)
        for pid in leftovers:  # hygiene: never leave an engine behind, even if it is a bug
            os.kill(pid, signal.SIGKILL)
    assert engines, "the engine runs its core in a child process of the worker"
    assert not leftovers, f"engine processes {leftovers} outlived their killed worker"

    killed.clear()
    stop = load_config(CONFIG, overrides(tiny_model_dir, tmp_path / "stop", **{
        "trainer.total_steps": 3, "trainer.max_staleness": 1}))
    with pytest.raises(RolloutFailedError, match=r"mid-stream.*died") as info:
        run_training(stop)  # closes the trainer itself
    assert "the run stops (trainer.on_rollout_failure=stop) after step 1" in str(info.value)
    assert [r["step"] for r in read_metrics(tmp_path / "stop" / "metrics.jsonl")] == [0, 1]


def test_drop_policy_gives_up_on_stragglers(ray_cluster, tiny_model_dir, tmp_path):
    """``rollout.agent`` in async mode: each streamed group is the agent's episodes through
    the gateway. With ``stale_policy: drop``, a group still generating at its deadline is
    cancelled and counted once finished groups can fill the batch; the steps never wait for
    it."""
    out = tmp_path / "drop"
    cfg = load_config(CONFIG, overrides(tiny_model_dir, out, **{
        "trainer.total_steps": 4, "trainer.max_staleness": 1, "trainer.stale_policy": "drop",
        "rollout.agent": "tests.rollout.gateway_agents:straggles",
        "trainer.infra_failures.rule": "drop_sample", "rollout.max_tokens_per_turn": 90,
        "data.shuffle": False}))
    trainer = Trainer(cfg)
    try:
        trainer.fit()
        rows = read_metrics(out / "metrics.jsonl")
        assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
        last = rows[-1]
        assert last["async/dropped_stale"] >= 1
        assert last["async/trained"] == 4 * BATCH
        trainer.schedule.buffer.check()
        trained = [d for s in (1, 2, 3, 4) for d in dumped(out, s)]
        # never waited for: a straggler's group that finished (after 60 s) would be trained
        assert all(str(d["row"]["id"])[-1] not in "05" for d in trained)
        assert all(d["infra_failure"] is None for d in trained)
        for r in rows[1:]:
            assert r["async/staleness_max"] <= 1
            assert r["async/trained"] == r["step"] * BATCH
            assert r["rollout/gateway_calls_mean"] >= 1  # the agent's calls, through the gateway
            assert len({d["uid"] for d in dumped(out, r["step"])}) == BATCH
    finally:
        trainer.close()
