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
from toolrl.trainer.run_dir import RunDirInUse, RunDirLock

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
