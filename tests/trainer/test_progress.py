"""`toolrl.trainer.progress`: the bound, and what firing does (no Ray: stand-in workers)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from toolrl.trainer.progress import (
    ProgressWatchdog,
    StallError,
    WatchdogConfig,
    note_phase,
    watching,
)


def _dog(tmp_path, lines, **config):
    def dump(where):
        path = where / "worker-rank0.txt"
        path.write_text("stand-in worker stacks")
        return [path]

    return ProgressWatchdog(WatchdogConfig(**config), tmp_path, step=lambda: 7,
                            waits=lambda: ["RolloutWorker.rollout on group 'g', ranks 0 (pid 1)"],
                            dump_workers=dump, err=lines.append)


def test_the_bound_is_the_first_step_bound_then_a_multiple_of_the_median(tmp_path):
    dog = _dog(tmp_path, [], first_step_s=100, after_steps=3, multiple=4, floor_s=2)
    assert dog.bound() == 100
    dog._durations = [1.0, 3.0, 2.0]
    assert dog.bound() == 8.0  # 4 x median 2
    dog._durations = [0.1, 0.1, 0.1]
    assert dog.bound() == 2  # the floor


def test_a_stall_dumps_stacks_prints_one_line_and_interrupts_the_driver(tmp_path):
    lines: list[str] = []
    dog = _dog(tmp_path, lines, first_step_s=0.5, floor_s=0.5, grace_s=30)
    note_phase("rollout")
    start = time.monotonic()
    with pytest.raises(StallError) as err, watching(dog):
        while time.monotonic() - start < 60:  # the driver "waits on a worker" forever
            time.sleep(0.01)
    assert time.monotonic() - start >= 0.5  # never before its bound
    assert len(lines) == 1 and lines[0] == str(err.value)
    assert "step 8" in lines[0] and "phase 'rollout'" in lines[0]
    assert "RolloutWorker.rollout on group 'g', ranks 0 (pid 1)" in lines[0]
    stalls = list((tmp_path / "stalls").iterdir())
    assert len(stalls) == 1
    driver = next(stalls[0].glob("driver-pid*.txt")).read_text()
    assert "test_a_stall_dumps_stacks" in driver  # the main thread's frame, where it waited
    assert (stalls[0] / "worker-rank0.txt").exists()


def test_steps_that_finish_keep_it_quiet(tmp_path):
    lines: list[str] = []
    dog = _dog(tmp_path, lines, first_step_s=1.0, after_steps=1, multiple=5, floor_s=1.0)
    with watching(dog):
        for _ in range(6):
            time.sleep(0.3)
            dog.step_done()
    assert lines == [] and dog.fired is None and not (tmp_path / "stalls").exists()


def test_a_driver_that_cannot_be_interrupted_is_ended_after_the_grace(tmp_path, monkeypatch):
    """SIGINT ignored (a ``&`` job): the line says the driver cannot be interrupted, and past
    ``grace_s`` the workers are killed and the process exits (os._exit, stubbed)."""
    lines: list[str] = []
    killed, exited = threading.Event(), []
    dog = _dog(tmp_path, lines, first_step_s=0.2, floor_s=0.2, grace_s=0.3)
    dog._kill_workers = killed.set
    monkeypatch.setattr("toolrl.trainer.progress.os._exit", exited.append)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    dog.start()
    try:
        assert killed.wait(30)
    finally:
        dog.stop()
        signal.signal(signal.SIGINT, before)
    assert exited == [1] and len(lines) == 3
    assert "SIGINT is ignored" in lines[1] and "did not stop" in lines[2]
