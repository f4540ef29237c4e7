"""Fault table, two runs into one run directory.

Expected: while a run holds its run dir, a second ``toolrl train`` into it fails at once with
one line naming the holder (exit 2), before it writes anything there or starts Ray; the
holder's files are untouched. The lock dies with its process (even SIGKILLed): the next run
takes the directory without any cleanup.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from toolrl import cli
from toolrl.trainer.run_dir import RunDirInUse, RunDirLock, RunDirMismatch, check_same_run

pytestmark = pytest.mark.timeout(120)

HOLD = """
import sys, time
from toolrl.trainer.run_dir import RunDirLock
lock = RunDirLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process (a run, as far as the lock can tell) holding ``tmp_path/run``."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        (run / "config.yaml").write_text("the holder's config\n")
        yield proc, run
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def test_a_second_run_into_a_used_run_dir_fails_fast(holder, tmp_path, capsys,
                                                     tiny_model_dir):
    import ray

    proc, run = holder
    config = tmp_path / "exp.yaml"
    config.write_text(f"model:\n  path: {tiny_model_dir}\ntrainer:\n  output_dir: {run}\n"
                      f"  total_steps: 1\ndata:\n  train_size: 16\n  val_size: 4\n")
    ray_was_up = ray.is_initialized()  # another test file's in-process cluster may be up
    start = time.monotonic()
    code = cli.main(["train", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"toolrl train: run dir {run} is in use by another run (pid "
                          f"{proc.pid} on ")
    assert "trainer.output_dir" in err
    assert time.monotonic() - start < 60
    assert (run / "config.yaml").read_text() == "the holder's config\n"
    assert sorted(p.name for p in run.iterdir()) == [".lock", "config.yaml"]
    assert ray.is_initialized() == ray_was_up  # the refused run started no Ray


def test_the_lock_dies_with_its_process(holder):
    proc, run = holder
    with pytest.raises(RunDirInUse, match=f"pid {proc.pid}"):
        RunDirLock(run).acquire()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    with RunDirLock(run) as lock:  # no stale lock to clean up
        assert f'"pid": {os.getpid()}' in lock.path.read_text()
    RunDirLock(run).acquire().release()  # released on exit: free again


def test_another_models_run_dir_is_not_resumed(tmp_path, capsys, tiny_model_dir):
    """A run dir holding checkpoints of ``model.path=A`` is refused by a config saying B (one
    line, exit 2, before Ray and before its config.yaml is overwritten)."""
    import ray

    run = tmp_path / "run"
    (run / "checkpoints" / "step_2").mkdir(parents=True)
    earlier = "model:\n  path: models/tiny\n  tiny_size: small\nenv:\n  id: toolrl/Calculator-v0\n"
    (run / "config.yaml").write_text(earlier)
    config = tmp_path / "exp.yaml"
    config.write_text(f"model:\n  path: {tiny_model_dir}\ntrainer:\n  output_dir: {run}\n"
                      f"  total_steps: 1\ndata:\n  train_size: 16\n  val_size: 4\n"
                      f"warm_start:\n  enabled: false\n")
    ray_was_up = ray.is_initialized()
    code = cli.main(["train", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"toolrl train: run dir {run} holds the checkpoints of a run with "
                          f"model.path='models/tiny', and this config says model.path="
                          f"'{tiny_model_dir}': set trainer.output_dir to another directory")
    assert (run / "config.yaml").read_text() == earlier
    assert ray.is_initialized() == ray_was_up


def test_what_a_run_dir_holds_decides_the_check(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    mine = {"model": {"path": "models/tiny", "tiny_size": "small"},
            "env": {"id": "toolrl/Calculator-v0"}}
    other = {**mine, "env": {"id": "toolrl/Tau2-v0"}}
    (run / "config.yaml").write_text("model:\n  path: models/tiny\n  tiny_size: small\n"
                                     "env:\n  id: toolrl/Calculator-v0\n")
    check_same_run(run, other, "auto")  # nothing to reuse yet: a config may change freely
    (run / "checkpoints" / "step_1").mkdir(parents=True)
    check_same_run(run, mine, "auto")
    check_same_run(run, other, "never")  # a fresh start reuses no checkpoint
    with pytest.raises(RunDirMismatch, match=r"checkpoints of a run with env\.id="):
        check_same_run(run, other, "auto")
    (run / "warm_start").mkdir()
    (run / "warm_start" / "config.json").write_text("{}")
    with pytest.raises(RunDirMismatch, match=r"warm_start of a run with env\.id="):
        check_same_run(run, other, "never")  # the warm start would still be reused
