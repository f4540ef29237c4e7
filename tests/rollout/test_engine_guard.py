"""The engine guard's wiring; the processes themselves are in
tests/faults/test_fault_engine_processes.py."""

from __future__ import annotations

import pickle
import subprocess
import sys

from toolrl.rollout import engine_guard


def test_install_wraps_vllms_process_entry_points_once_and_by_name():
    from vllm.v1.engine.core import EngineCoreProc
    from vllm.v1.executor.multiproc_executor import WorkerProc

    engine_guard.install()
    engine_guard.install()  # idempotent: the originals are kept, not the wrappers
    assert EngineCoreProc.run_engine_core is engine_guard.run_engine_core
    assert WorkerProc.worker_main is engine_guard.worker_main
    assert engine_guard._ORIGINALS["engine_core"] is not engine_guard.run_engine_core
    assert engine_guard._ORIGINALS["worker"].__module__.startswith("vllm.")
    # spawn pickles a process target by name: the child imports this module and runs the guard
    assert pickle.loads(pickle.dumps(EngineCoreProc.run_engine_core)) is \
        engine_guard.run_engine_core
    assert b"toolrl.rollout.engine_guard" in pickle.dumps(WorkerProc.worker_main)


FORKED = """
import os
from multiprocessing import forkserver
from toolrl.rollout import engine_guard
forkserver.ensure_running()
parent_server = engine_guard.fork_server_pid()
pid = os.fork()
if pid == 0:  # the parent's server is not this process's: it starts its own
    ok = engine_guard.fork_server_pid() is None
    forkserver.ensure_running()
    ok = ok and engine_guard.fork_server_pid() not in (None, parent_server)
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert engine_guard.fork_server_pid() == parent_server
raise SystemExit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_starts_its_own_fork_server():
    """A process forked from one that runs a fork server (torch.multiprocessing with fork, a
    user's os.fork) lets go of the parent's server: waiting on it failed there
    (ChildProcessError), and holding its "alive" pipe would keep it past the parent's exit.
    (Run in a child interpreter: a server started here without vLLM preloaded would be this
    test process's for its later engines.)"""
    proc = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
