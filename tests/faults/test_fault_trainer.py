"""Trainer faults: a rollout worker killed mid-step; a checkpoint save killed midway."""

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
from toolrl.trainer.config import load_config
from toolrl.trainer.tracking import read_metrics
from toolrl.trainer.trainer import Trainer

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
    step after it equals an uninterrupted run's."""
    common = {"trainer.total_steps": 3, "trainer.save_every": 1, "actor.lr": 1e-3}
    reference = run_training_in_process(small_run_overrides(tiny_model_dir, tmp_path / "ref",
                                                            **common))
    assert [r["step"] for r in reference] == [0, 1, 2, 3]

    out = tmp_path / "killed"
    args = small_run_overrides(tiny_model_dir, out, **common)
    env = {**os.environ, "TOOLRL_FAULT_CHECKPOINT_DELAY_S": "2",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)  # the child starts its own cluster
    # Every save of the child takes 2 s more, so the kill lands inside step 3's save.
    ckpts = out / "checkpoints"
    _kill_when([sys.executable, str(ROOT / "tests" / "trainer_runs.py"), *args],
               ckpts / ".tmp-step_3", timeout=900, env=env)
    assert (ckpts / "step_2" / "COMPLETE").exists()
    assert not (ckpts / "step_3").exists()  # the torn save never became a checkpoint

    resumed = run_training_in_process(args)  # resume=auto: the newest complete, step_2
    steps = [r["step"] for r in resumed]
    assert steps == sorted(set(steps)) and steps[-1] == 3, steps  # no duplicated rows
    ref3 = next(r for r in reference if r["step"] == 3)
    got3 = next(r for r in resumed if r["step"] == 3)
    for key in ("train/reward_mean", "rollout/sampled_tokens", "actor/loss", "actor/grad_norm",
                "policy_version"):
        assert got3[key] == pytest.approx(ref3[key], rel=1e-5, abs=1e-6), key


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
