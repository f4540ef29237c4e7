"""Trainer faults: a rollout worker killed mid-step (the run stops, or retries), a rollout that
keeps failing, a weight push that does nothing (the canary), a checkpoint save killed midway."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from trainer_runs import ROOT, register_test_rewards, run_training_in_process, small_run_overrides

from toolrl.controller import WorkerGroupError
from toolrl.rollout import engine_guard
from toolrl.rollout.worker import RolloutWorker
from toolrl.trainer.config import load_config
from toolrl.trainer.failures import RolloutFailedError
from toolrl.trainer.schedule import SyncSchedule
from toolrl.trainer.tracking import read_metrics
from toolrl.trainer.trainer import Trainer
from toolrl.weights.canary import SyncCanaryError

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _kill_when(cmd: list[str], ready: Path, timeout: float, env: dict[str, str]) -> None:
    """Start ``cmd`` in its own session; SIGKILL the whole session once ``ready`` exists."""
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    try:
        while not ready.exists():
            if proc.poll() is not None:
                raise AssertionError(f"the run exited ({proc.returncode}) before {ready}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{ready} did not appear within {timeout} s")
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run, its Ray cluster, its engine
        proc.wait(timeout=60)


@pytest.mark.timeout(1500)
def test_checkpoint_killed_midway(ray_cluster, tiny_model_dir, tmp_path):
    """Kill the run while step 3's checkpoint is being written: resume picks step 2, and the
    step after it equals the one the killed run trained (and logged) before its save began."""
    out = tmp_path / "killed"
    args = small_run_overrides(tiny_model_dir, out, **{
        "trainer.total_steps": 3, "trainer.save_every": 1, "actor.lr": 1e-3})
    env = {**os.environ, "TOOLRL_FAULT_CHECKPOINT_DELAY_S": "2",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)  # the child starts its own cluster
    # Every save of the child takes 2 s more, so the kill lands inside step 3's save.
    ckpts = out / "checkpoints"
    _kill_when([sys.executable, str(ROOT / "tests" / "trainer_runs.py"), *args],
               ckpts / ".tmp-step_3", timeout=900, env=env)
    assert (ckpts / "step_2" / "COMPLETE").exists()
    assert not (ckpts / "step_3").exists()  # the torn save never became a checkpoint
    killed = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in killed] == [0, 1, 2, 3]  # step 3 is logged before its save

    resumed = run_training_in_process(args)  # resume=auto: the newest complete, step_2
    steps = [r["step"] for r in resumed]
    assert steps == [0, 1, 2, 3], steps  # step 3 redone, its row replaced: none duplicated
    for key in ("train/reward_mean", "rollout/sampled_tokens", "actor/loss", "actor/grad_norm",
                "policy_version"):
        assert resumed[3][key] == pytest.approx(killed[3][key], rel=1e-5, abs=1e-6), key


@pytest.mark.timeout(900)
def test_rollout_worker_killed(ray_cluster, tiny_model_dir, tmp_path):
    """A worker process dies mid-step: fit raises a clear error naming it, and the step in
    flight is never logged (no training on a partial batch)."""
    register_test_rewards()
    cfg = load_config(ROOT / "configs/quickstart.yaml", small_run_overrides(
        tiny_model_dir, tmp_path / "run", **{"trainer.total_steps": 50}))
    trainer = Trainer(cfg)
    trainer.setup()
    group = trainer.handles["rollout"].group
    pid = group.pids[0]
    metrics = cfg.run_dir / "metrics.jsonl"

    logged_at_kill: list[int] = []

    def kill_in_step_2() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            steps = [r["step"] for r in read_metrics(metrics)]
            if 1 in steps:  # step 2 (or a later one) is in flight now
                logged_at_kill.extend(steps)
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_in_step_2, daemon=True)
    killer.start()
    start = time.monotonic()
    try:
        with pytest.raises(WorkerGroupError) as err:
            trainer.fit()
        killed_at = time.monotonic()
    finally:
        trainer.close()
    killer.join(timeout=5)
    assert "rollout" in str(err.value) and str(pid) in str(err.value), str(err.value)
    assert killed_at - start < 600
    # the step in flight when the worker died is never logged: nothing trained on a partial
    # batch, and every logged step is a whole one
    steps = [r["step"] for r in read_metrics(metrics)]
    assert steps == logged_at_kill and steps[:2] == [0, 1], (steps, logged_at_kill)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _engine_pids(trainer: Trainer) -> list[int]:
    return [p for pids in trainer.handles["rollout"].call(RolloutWorker.engine_pids)
            for p in pids]


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.timeout(900)
def test_rollout_worker_killed_is_retried(ray_cluster, tiny_model_dir, tmp_path):
    """trainer.on_rollout_failure=retry: the dead worker (here the process the rollout role
    shares with the actor) and its engine are restarted, the run goes on from the last
    complete checkpoint, redoes the step in flight and finishes; every step is logged once,
    and the weight-sync canary agrees after every push."""
    register_test_rewards()
    cfg = load_config(ROOT / "configs/quickstart.yaml", small_run_overrides(
        tiny_model_dir, tmp_path / "run", **{"trainer.total_steps": 4, "trainer.save_every": 1,
                                              "trainer.on_rollout_failure": "retry",
                                              "trainer.max_retries": 1}))
    trainer = Trainer(cfg)
    trainer.setup()
    pid = trainer.handles["rollout"].group.pids[0]
    engines = _engine_pids(trainer)
    # the worker's core is forked by the driver's (this process's) fork server, not by one of
    # the worker's own, and must still die with the worker (`engine_guard`)
    assert engines and all(psutil.Process(p).ppid() == engine_guard.fork_server_pid()
                           for p in engines)
    metrics = cfg.run_dir / "metrics.jsonl"

    saved = cfg.run_dir / "checkpoints" / "step_1" / "COMPLETE"

    def kill_in_step_2() -> None:  # once step 1 is saved (not between its log and its save)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if saved.exists():
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_in_step_2, daemon=True)
    killer.start()
    try:
        trainer.fit()
        new_pid = trainer.handles["rollout"].group.pids[0]
    finally:
        trainer.close()
    killer.join(timeout=5)
    rows = read_metrics(metrics)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # each step once, none lost
    assert new_pid != pid and _gone(pid)
    deadline = time.monotonic() + 30  # the killed worker's engine processes go too
    while not all(_gone(p) for p in engines) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(_gone(p) for p in engines), [p for p in engines if not _gone(p)]
    assert rows[-1]["trainer/rollout_retries"] == 1
    assert all(r["sync/probe_max_abs_diff"] < 1e-3 for r in rows[1:])


@pytest.mark.timeout(600)
def test_rollout_failures_stop_after_max_retries(ray_cluster, tiny_model_dir, tmp_path):
    """A rollout that fails every time is retried max_retries times, then the run stops with
    one message naming the failure; nothing is logged for the failed step."""
    register_test_rewards()
    cfg = load_config(ROOT / "configs/quickstart.yaml", small_run_overrides(
        tiny_model_dir, tmp_path / "run", **{"trainer.total_steps": 3,
                                              "trainer.on_rollout_failure": "retry",
                                              "trainer.max_retries": 2}))
    attempts = []

    class BrokenRollout(Trainer):
        def rollout(self, rows, n, seed, greedy=False, uids=None):
            if self.step >= 1 and not greedy:  # step 2 onwards: the rollout raises
                attempts.append(self.step)
                try:
                    raise RuntimeError("engine exploded")
                except RuntimeError as e:
                    raise RolloutFailedError(f"rollout of step {self.step + 1} failed "
                                             f"({e})") from e
            return super().rollout(rows, n, seed, greedy, uids)

    trainer = BrokenRollout(cfg)
    try:
        with pytest.raises(RolloutFailedError, match=r"engine exploded.*2 retries in a row "
                                                     r"\(trainer.max_retries=2\)"):
            trainer.fit()
    finally:
        trainer.close()
    assert attempts == [1, 1, 1]  # the first try and two retries of the same step
    assert [r["step"] for r in read_metrics(cfg.run_dir / "metrics.jsonl")] == [0, 1]


@pytest.mark.timeout(600)
def test_a_weight_push_that_does_nothing_stops_the_run(ray_cluster, tiny_model_dir, tmp_path):
    """The weight-sync canary: a push that silently leaves the engine on the old weights is
    caught after the first update (sync/probe_max_abs_diff past the fp32 tolerance) and stops
    the run naming the version; with trainer.sync_canary=warn the run goes on and logs it."""
    register_test_rewards()

    class SilentSync(SyncSchedule):
        def sync_weights(self) -> int:  # reports a new version, loads nothing
            self.fake_version = getattr(self, "fake_version", 0) + 1
            return self.fake_version

    overrides = {"trainer.total_steps": 2, "actor.lr": 1e-2}
    cfg = load_config(ROOT / "configs/quickstart.yaml", small_run_overrides(
        tiny_model_dir, tmp_path / "stop", **overrides))
    trainer = Trainer(cfg)
    trainer.schedule = SilentSync(trainer)
    try:
        with pytest.raises(SyncCanaryError, match=r"policy version 1 .*disagree"):
            trainer.fit()
    finally:
        trainer.close()
    assert [r["step"] for r in read_metrics(cfg.run_dir / "metrics.jsonl")] == [0]

    cfg = load_config(ROOT / "configs/quickstart.yaml", small_run_overrides(
        tiny_model_dir, tmp_path / "warn", **overrides, **{"trainer.sync_canary": "warn"}))
    trainer = Trainer(cfg)
    trainer.schedule = SilentSync(trainer)
    try:
        trainer.fit()
    finally:
        trainer.close()
    rows = read_metrics(cfg.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["sync/probe_max_abs_diff"] > 1e-3 for r in rows[1:])
