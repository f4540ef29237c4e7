"""The engine guard's wiring; the processes themselves are in
tests/faults/test_fault_engine_processes.py."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time

import psutil

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


OWNER = """
import json, sys, time
from toolrl.rollout import engine_guard
engine_guard.PRELOAD = ()  # a server of its own (the fallback) starts at once
pid = engine_guard.join_fork_server(json.loads(sys.argv[1]))
core = engine_guard._ForkedCore(target=time.sleep, args=(300,))
core.start()
print(json.dumps({"server": pid, "core": core.pid, "joined": bool(engine_guard._SHARED)}),
      flush=True)
time.sleep(300)
"""


def _owner(server: dict) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, json.dumps(server)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line, proc.wait(30)
    return proc, json.loads(line)


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_a_process_on_this_machine_forks_its_cores_from_the_drivers_server():
    """A Ray worker joins the driver's fork server (`RolloutWorker.early_start`): its core is
    forked by that server, dies when the worker is SIGKILLed (it watches its owner), and the
    server lives on for the next worker. A server it cannot reach (another machine, a socket
    gone) means a server of its own."""
    server = engine_guard.shared_fork_server()
    assert server is not None and server["pid"] == engine_guard.fork_server_pid()
    owner, info = _owner(server)
    try:
        assert info["joined"] and info["server"] == server["pid"]
        core = psutil.Process(info["core"])
        assert core.ppid() == server["pid"]  # not the owner's child
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(30)
        assert _gone(info["core"], 30), "the core outlived its owner"
        assert psutil.pid_exists(server["pid"])  # the driver's server stays
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(30)

    for elsewhere in ({**server, "boot_id": "another-machine"},
                      {**server, "address": server["address"] + "-gone"}):
        owner, info = _owner(elsewhere)
        try:
            assert not info["joined"] and info["server"] != server["pid"]
            assert psutil.Process(info["core"]).ppid() == info["server"]
            assert psutil.Process(info["server"]).ppid() == owner.pid  # its own
        finally:  # (a vLLM core asks for SIGKILL with its server; this stand-in does not)
            for pid in (info["core"], owner.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            owner.wait(30)


CLUSTERS = """
import psutil
from toolrl.controller import init_ray, shutdown_ray
from toolrl.rollout import engine_guard
engine_guard.PRELOAD = ()  # the server starts at once
servers = []
for _ in range(2):  # two runs in one process, each on a local cluster of its own
    init_ray(num_cpus=1)
    servers.append(engine_guard.shared_fork_server()["pid"])
    shutdown_ray()
    assert psutil.Process(servers[-1]).status() != psutil.STATUS_ZOMBIE, "the server was stopped"
assert servers[0] == servers[1], servers
psutil.Process(servers[0]).kill()  # and one reaped by another hand is started anew
psutil.wait_procs([psutil.Process(servers[0])], timeout=30)
again = engine_guard.start_fork_server()
assert again != servers[0] and psutil.Process(again).ppid() == psutil.Process().pid, again
"""


def test_the_drivers_fork_server_outlives_its_clusters_and_restarts_once_reaped():
    """A process that runs several trainers one after another (a benchmark, a notebook) keeps
    its fork server across `shutdown_ray`, which stops everything else under the process; and
    a server that ended and was reaped elsewhere is replaced at the next engine: waiting on
    its pid raised ChildProcessError in multiprocessing, so the second run failed to start."""
    proc = subprocess.run([sys.executable, "-c", CLUSTERS], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
