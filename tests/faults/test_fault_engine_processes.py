"""vLLM's engine processes die with their owner (`toolrl.rollout.engine_guard`).

- The process that started a `VLLMEngine` is SIGKILLed: its ``EngineCore`` (and, with
  ``multiprocessing``, the model worker below it) follow at once. No Ray here to clean up
  after it: without the guard both outlive it (measured: still there after 10 s, ppid 1).
- A training run's driver is SIGKILLed or SIGTERMed mid-run: the rollout worker's process,
  its ``EngineCore`` and everything below are gone soon after.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from trainer_runs import ROOT, small_run_overrides

from toolrl.trainer.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _tree(pid: int) -> dict[int, str]:
    """``pid``'s descendants and their command lines."""
    out = {}
    for proc in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            out[proc.pid] = " ".join(proc.cmdline()) or proc.name()
    return out


def _marked(entry: str) -> dict[int, str]:
    """Every process whose environment holds ``entry`` and its command line: what a run
    started, wherever Ray's process tree put it."""
    out = {}
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError), \
                open(f"/proc/{proc.pid}/environ", "rb") as f:
            if entry.encode() in f.read().split(b"\0"):
                out[proc.pid] = " ".join(proc.cmdline()) or proc.name()
    return out


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
    return out


OWNER = """
import json, sys, time
from toolrl.rollout.engine import EngineConfig, VLLMEngine
engine = VLLMEngine(EngineConfig(model=sys.argv[1], max_model_len=256,
                                 multiprocessing=sys.argv[2] == "1"))
print("PIDS", json.dumps(engine.engine_pids), flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("multiprocessing", [False, True], ids=["in-process", "multiprocessing"])
def test_a_killed_owner_takes_its_engine_processes(tiny_model_dir, multiprocessing):
    """No Ray here to clean up after it: only the engine's own guard stops the orphans."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tiny_model_dir), str(int(multiprocessing))],
        cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True)
    tree: dict[int, str] = {}
    try:
        for line in owner.stdout:  # vLLM prints to stdout too
            if line.startswith("PIDS "):
                break
        else:
            raise AssertionError(f"the engine did not start ({owner.wait(timeout=30)})")
        tree = _tree(owner.pid)
        pids = json.loads(line[5:])  # the engine's own: its core and, below it, its worker
        assert set(pids) <= set(tree)
        # on CPU the core is forked from the owner's fork server (`engine_guard`), which is in
        # the tree too, and must go as well
        engines = [pid for pid in pids if psutil.Process(pid).ppid() not in pids]
        assert len(engines) == 1, tree
        below = [pid for pid in tree if psutil.Process(pid).ppid() == engines[0]]
        assert len(below) == int(multiprocessing), tree  # vLLM's model worker process
        owner.kill()
        owner.wait(timeout=30)
        deadline = time.monotonic() + 30  # they go at once; a loaded suite may be slow to run them
        while (left := _alive(tree)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left == [], {pid: tree[pid] for pid in left}
    finally:
        _end_session(owner, tree)  # never leave one behind, even when the test fails
        owner.stdout.close()


@pytest.mark.timeout(600)
def test_a_killed_driver_leaves_no_engine_process(tiny_model_dir, tmp_path):
    """A short run with the experiments' default engine: once its first step is logged the
    driver alone is SIGKILLed; the rollout worker's process, its ``EngineCore`` and every
    process below it are gone soon after (SIGTERM, which the driver handles:
    tests/faults/test_fault_stalls.py::test_a_signal_ends_the_run_cleanly). The run's
    processes are found by an environment entry they all inherit, not by walking the driver's
    tree. (Ray's own daemons of the driver's cluster are Ray's to stop; they are cleaned up
    here, not counted.)"""
    out = tmp_path / "run"
    mark = f"engine-test-{uuid.uuid4().hex}"  # inherited by every process the run starts
    env = {**os.environ, "TOOLRL_TEST_MARK": mark,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)  # the driver starts a cluster of its own
    log = tmp_path / "driver.log"  # what the driver said, for a run that never gets going
    with open(log, "w") as sink:
        driver = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "trainer_runs.py"),
             *small_run_overrides(tiny_model_dir, out, **{
                 "trainer.total_steps": 1000, "rollout.engine.multiprocessing": True})],
            cwd=ROOT, env=env, start_new_session=True, stdout=sink, stderr=subprocess.STDOUT)
    tree: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 400
        engines: list[int] = []
        while not (read_metrics(out / "metrics.jsonl") and engines):  # the engine serves
            assert driver.poll() is None, \
                f"the run exited ({driver.returncode}) early: {tree}\n{_tail(log)}"
            assert time.monotonic() < deadline, \
                f"no step and engine within 400 s: {tree}\ndriver's output:\n{_tail(log)}"
            time.sleep(0.2)
            tree = _marked("TOOLRL_TEST_MARK=" + mark)
            engines = _engine_cores(tree)
        [engine] = engines
        # on CPU the core is forked from the driver's fork server (`engine_guard`), not from
        # the Ray worker that runs the rollout role, which it watches instead
        server = psutil.Process(engine).ppid()
        assert psutil.Process(server).ppid() == driver.pid, "not forked by the driver's server"
        workers = [p for p, cmd in tree.items() if cmd.startswith("ray::_WorkerHost")]
        assert workers, tree  # the rollout worker's process (Ray's daemons are Ray's to stop)
        watched = {server: tree.get(server, ""), engine: tree[engine],
                   **{p: tree[p] for p in workers},
                   **{p.pid: tree.get(p.pid, "") for p in
                      psutil.Process(engine).children(recursive=True)}}
        driver.send_signal(signal.SIGKILL)  # the driver alone: its tree must follow on its own
        driver.wait(timeout=60)
        deadline = time.monotonic() + 60
        while (left := _alive(watched)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], {pid: watched[pid] for pid in left}
    finally:
        _end_session(driver, tree)
        for pid in _marked("TOOLRL_TEST_MARK=" + mark):  # Ray's daemons, wherever they are
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _engine_cores(tree: dict[int, str]) -> list[int]:
    """The engine cores among ``tree``: the children of a fork server
    (`toolrl.rollout.engine_guard`). A forked core keeps its server's command line (vLLM
    titles it ``VLLM::EngineCore``, but a fresh-clone suite run twice saw it keep the one it
    started with), so a server is told from its cores by its parent, which is not one."""
    def forkserver(proc: psutil.Process | None) -> bool:
        return proc is not None and "multiprocessing.forkserver" in " ".join(proc.cmdline())

    out = []
    for pid in tree:
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(pid).parent()
            if forkserver(parent) and not forkserver(parent.parent()):
                out.append(pid)
    return out


def _tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:]


def _end_session(proc: subprocess.Popen, tree: dict[int, str]) -> None:
    """Kill what is left of ``proc``'s session (processes of ``tree`` only while they are
    still in that session: a recycled pid is someone else's)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in _alive(tree):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getsid(pid) == proc.pid:
                os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
