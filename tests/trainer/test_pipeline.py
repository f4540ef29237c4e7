"""Pipeline mode (one-step off-policy on split pools) on the real stack: Ray, a vLLM CPU engine
on its own pool, FSDP2 on gloo, weights over a gloo broadcast group. Two trainers in all."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch
from trainer_runs import register_test_rewards, small_run_overrides, wait_gone

from toolrl import batch as B
from toolrl.rollout.worker import RolloutWorker, make_rollout_input
from toolrl.trainer import checkpoint as ckpt
from toolrl.trainer.config import ConfigError, load_config
from toolrl.trainer.pipeline import (
    PendingRollout,
    PipelineSchedule,
    RolloutFailedError,
)
from toolrl.trainer.run import run_training
from toolrl.trainer.tracking import read_metrics
from toolrl.trainer.trainer import Trainer
from toolrl.workers.actor import ActorWorker

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "quickstart_pipeline.yaml"


def overrides(model: Path, out: Path, **extra: object) -> list[str]:
    """The shared small run, with room for two turns' context; weight pushes in many small
    buckets (each received straight into the engine's staging)."""
    register_test_rewards()
    return small_run_overrides(model, out, **{
        "actor.weight_bucket_mb": 0.5,
        "rollout.max_total_tokens": 512, "rollout.engine.max_model_len": 512,
        "rollout.engine.kv_cache_gib": 0.25, "trainer.log_rollouts": 8,
        "trainer.call_timeout_s": 300, "trainer.export_hf": False,
        "reward": "{rewards: [{name: test_digit_fraction}]}", **extra})


# --- config ------------------------------------------------------------------------------------
def test_pipeline_mode_without_a_correction_is_refused_unless_on_purpose(tmp_path):
    none = {"actor.loss.corrections": "[]"}
    with pytest.raises(ConfigError, match=r"trainer.mode=pipeline trains on samples of older "
                                          r"weights but actor.loss.corrections is empty"):
        load_config(CONFIG, overrides(tmp_path, tmp_path, **none))
    cfg = load_config(CONFIG, overrides(tmp_path, tmp_path, **none,
                                        **{"trainer.allow_uncorrected": True}))
    assert cfg.actor.loss.corrections == []
    shipped = load_config(CONFIG).actor.loss.corrections
    assert [(c.name, c.cap) for c in shipped] == [("tis", 2.0)]
    with pytest.raises(ConfigError, match=r"allow_uncorrected=true with actor\.loss\.corrections"):
        load_config(CONFIG, overrides(tmp_path, tmp_path, **{"trainer.allow_uncorrected": True}))


def test_sync_stays_the_default_mode():
    assert load_config(ROOT / "configs" / "quickstart.yaml").trainer.mode == "sync"


def test_the_pipeline_quickstart_is_the_quickstart_in_pipeline_mode():
    from toolrl.trainer.config import to_dict

    sync = to_dict(load_config(ROOT / "configs" / "quickstart.yaml"))
    pipe = to_dict(load_config(CONFIG))
    assert pipe["trainer"].pop("mode") == "pipeline" and sync["trainer"].pop("mode") == "sync"
    assert pipe["actor"]["loss"].pop("corrections") == [
        {"name": "tis", "cap": 2.0, "low": None, "high": None, "level": None}]
    assert sync["actor"]["loss"].pop("corrections") == []
    assert sync["resources"].pop("cpus_per_process") == 2  # one colocated process, both cores
    assert pipe["resources"].pop("cpus_per_process") == 1  # one core per pool
    pipe["resources"].pop("rollout_processes_per_node")
    sync["resources"].pop("rollout_processes_per_node")
    for cfg in (sync, pipe):
        cfg.pop("experiment_name")
    assert pipe == sync


def test_rollout_pool_size_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="rollout_processes_per_node"):
        load_config(CONFIG, overrides(tmp_path, tmp_path,
                                      **{"resources.rollout_processes_per_node": 0}))


# --- the real pipeline -------------------------------------------------------------------------
def _max_abs_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.bool()
    return float((a[m] - b[m]).abs().max()) if m.any() else 0.0


def _dumped(out: Path, step: int) -> list[dict]:
    path = out / "rollouts" / f"step_{step}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_pipeline_bounds_staleness_syncs_the_actors_weights_and_resumes(
        ray_cluster, tiny_model_dir, tmp_path):
    """3 steps (checkpoint at 2), checks of the weights in the engine, then a resumed run."""
    out = tmp_path / "run"
    cfg = load_config(CONFIG, overrides(tiny_model_dir, out, **{
        "trainer.total_steps": 3, "trainer.save_every": 2, "actor.lr": 1e-3}))
    trainer = Trainer(cfg)
    try:
        trainer.fit()
        # two pools: the engine lives in a process of its own
        rollout, actor = trainer.handles["rollout"], trainer.actor
        assert rollout.group is not actor.group
        assert set(rollout.group.pids).isdisjoint(actor.group.pids)

        rows = read_metrics(out / "metrics.jsonl")
        assert [r["step"] for r in rows] == [0, 1, 2, 3]
        train = rows[1:]
        # step 1 trains on the initial weights' samples; later steps on one-step-old ones
        assert [r["pipeline/staleness_max"] for r in train] == [0.0, 1.0, 1.0]
        assert all(r["pipeline/staleness_mean"] <= r["pipeline/staleness_max"] <= 1
                   for r in train)
        assert [r["policy_version"] for r in train] == [1.0, 2.0, 3.0]
        # per trained token: pushes land between rollouts, so every token has its sample's lag
        assert [r["pipeline/token_lag_1"] for r in train] == [0.0, 1.0, 1.0]
        assert [r["pipeline/token_staleness_max"] for r in train] == [0.0, 1.0, 1.0]
        assert all(0 <= r["actor/tis_capped"] <= 1 for r in train)  # the config's correction
        # per sample: every dumped trajectory carries the version that generated it
        for step, version in ((1, 0), (2, 0), (3, 1)):
            assert {d["policy_version"] for d in _dumped(out, step)} == {version}, step

        # the checkpoint at step 2 records the data position before batch 3 (in flight)
        state = ckpt.load_trainer_state(out / "checkpoints" / "step_2", restore_rng=False)
        assert state["step"] == 2 and state["data"] == {"epoch": 0, "index": 4}

        # the last batch was stale: the engine's log-probs differ from the actor's ...
        last = trainer._last_batch
        stale_gap = _max_abs_gap(last[B.ROLLOUT_LOG_PROBS], last[B.OLD_LOG_PROBS],
                                 last[B.RESPONSE_MASK])
        assert stale_gap > 1e-3
        # ... after the sync the engine's weights are exactly the actor's
        version = trainer.schedule.sync_weights(checksum=True)
        assert version == 4
        actor_sum = actor.call(ActorWorker.weights_checksum)[0]
        assert rollout.call(RolloutWorker.loaded_weights_checksum) == [actor_sum]
        # ... and the engine computes with them: its log-probs match the actor's
        fresh = trainer.rollout(trainer.val_rows, 2, seed=123)
        assert set(fresh[B.POLICY_VERSION].tolist()) == {4}
        fresh.update(actor.call(ActorWorker.compute_log_prob, fresh))
        gap = _max_abs_gap(fresh[B.ROLLOUT_LOG_PROBS], fresh[B.OLD_LOG_PROBS],
                           fresh[B.RESPONSE_MASK])
        assert gap < 1e-4 < stale_gap

        # a rollout that raises is reported with the worker's name; the group stays usable
        bad = make_rollout_input(trainer.val_rows[:1], n=1)
        del bad[B.ROWS]
        pending = PendingRollout(rollout.call_async(RolloutWorker.rollout, bad), 9, {})
        with pytest.raises(RolloutFailedError, match=r"step 9.*role 'rollout', rank 0"):
            trainer.schedule.collect(pending)
        assert rollout.call(RolloutWorker.check_health) == [True]
    finally:
        trainer.close()

    # resumed from step 2: batch 3 is generated again from the same task rows, on the restored
    # weights (pushed to the engine at restore, so the batch is on-policy)
    first_tasks = [d["row"]["id"] for d in _dumped(out, 3)]
    resumed = Trainer(load_config(CONFIG, overrides(tiny_model_dir, out, **{
        "trainer.total_steps": 3, "trainer.save_every": 2, "actor.lr": 1e-3})))
    try:
        resumed.fit()
    finally:
        resumed.close()
    assert [d["row"]["id"] for d in _dumped(out, 3)] == first_tasks
    row = read_metrics(out / "metrics.jsonl")[-1]
    assert row["step"] == 3 and row["pipeline/staleness_max"] == 0.0


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def test_rollout_worker_death_during_overlap_stops_cleanly(ray_cluster, tiny_model_dir,
                                                           tmp_path, monkeypatch):
    """Kill the rollout worker while it generates the batch of step 2 (step 1 trains
    meanwhile): `toolrl train`'s entry point raises naming the worker as soon as Ray notices (a
    hang would end in a WorkerTimeoutError instead) and logs no step that did not finish."""
    out = tmp_path / "killed"
    cfg = load_config(CONFIG, overrides(tiny_model_dir, out, **{
        "trainer.total_steps": 3, "rollout.concurrency": 1,  # a long rollout: episodes in turn
        "rollout.max_tokens_per_turn": 48, "rollout.max_turns": 3}))
    launch = PipelineSchedule.launch_rollout
    victim: dict[str, object] = {}

    def launch_then_kill(self: PipelineSchedule, step: int) -> PendingRollout:
        if step != 2:
            return launch(self, step)
        rollout = self.t.handles["rollout"]
        victim["engine"] = engines = rollout.call(RolloutWorker.engine_pids)[0]
        victim["pid"] = rollout.group.pids[0]
        busy = _cpu_seconds(engines)
        pending = launch(self, step)
        # kill once the engine computes for this rollout (not before it starts, not after)
        deadline = time.monotonic() + 60
        while _cpu_seconds(engines) < busy + 0.05 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(int(victim["pid"]), signal.SIGKILL)
        return pending

    monkeypatch.setattr(PipelineSchedule, "launch_rollout", launch_then_kill)
    try:
        with pytest.raises(RolloutFailedError) as info:
            run_training(cfg)  # dispatches on trainer.mode; closes the trainer itself
    finally:
        leftovers = wait_gone(list(victim.get("engine", [])), timeout=60)
        for pid in leftovers:  # hygiene: never leave an engine behind, even if it is a bug
            os.kill(pid, signal.SIGKILL)
    assert victim["engine"], "the engine runs its core in a child process of the worker"
    message = str(info.value)
    assert "step 2" in message and "role 'rollout', rank 0" in message, message
    assert f"pid {victim['pid']}" in message and "died" in message, message
    # step 1 trained but was never synced: neither it nor step 2 has a row
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0]
    assert not (out / "checkpoints").exists() or not list((out / "checkpoints").iterdir())
    assert not leftovers, f"engine processes {leftovers} outlived their killed worker"
