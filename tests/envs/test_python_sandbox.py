"""toolrl/PythonSandbox-v0: scripted policy, and what the sandbox refuses to let code do."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid

import pytest
from toolrl.envs.python_sandbox import env as sandbox_env
from toolrl.envs.python_sandbox.env import PythonSandboxEnv
from toolrl.envs.python_sandbox.sandbox import Limits, SandboxUnavailable, run_python

from toolrl.core.env import run_episode
from toolrl.core.registration import make_env


def call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def sandboxed(code: str, **limits) -> object:
    return asyncio.run(run_python(code, Limits(**limits)))


def test_scripted_policy_computes_and_submits():
    env = make_env("toolrl/PythonSandbox-v0")
    for row in PythonSandboxEnv.make_tasks(5, seed=0):
        ep = asyncio.run(run_episode(env, row=row))
        assert ep.success and not ep.errors, row["question"]
        assert ep.messages[3]["content"].strip() == str(row["ground_truth"])
    env.close()


def test_no_network_even_to_loopback():
    """A server listening on the host's loopback is unreachable from the sandbox."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    code = ("import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('CONNECTED')\nexcept OSError as e:\n    print('blocked', e.errno)\n"
            "import urllib.request\n"
            "try:\n    urllib.request.urlopen('http://example.com', timeout=2)\n"
            "    print('CONNECTED')\nexcept OSError as e:\n    print('blocked')\n")
    result = sandboxed(code)
    server.setblocking(False)  # a completed handshake would be waiting in the backlog
    with pytest.raises(BlockingIOError):
        server.accept()
    server.close()
    assert "CONNECTED" not in result.stdout and result.stdout.count("blocked") == 2


def test_limits_cpu_memory_files_processes_and_output():
    cpu = sandboxed("while True: pass", cpu_s=1, wall_s=60)
    # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one (PID 1 ignores SIGXCPU)
    assert cpu.exit_code in (128 + 24, 128 + 9) and not cpu.timed_out
    memory = sandboxed("x = bytearray(3 << 30)", memory_bytes=512 << 20)
    assert "MemoryError" in memory.stderr
    big = sandboxed("open('f', 'wb').write(b'x' * (4 << 20))", file_bytes=1 << 20)
    assert "File too large" in big.stderr
    forks = sandboxed("import os\nn = 0\ntry:\n    for _ in range(100):\n"
                      "        if os.fork() == 0:\n            import time; time.sleep(2)\n"
                      "            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\n"
                      "print(n)", processes=8)
    assert int(forks.stdout) < 8
    flood = sandboxed("while True: print('x' * 1000)", max_output_bytes=10_000)
    assert flood.output_exceeded and len(flood.stdout) == 10_000
    # killed and reaped: its exit is known (an unread pipe once hid the end: wait() timed out)
    assert flood.exit_code == -9  # SIGKILL, reaped at once


def test_wall_clock_kills_the_whole_process_tree():
    marker = uuid.uuid4().hex
    code = ("import subprocess, sys, time\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'],"
            " start_new_session=True)\nprint('started', flush=True)\ntime.sleep(600)\n")
    result = sandboxed(code, wall_s=10)  # two interpreters start first, on a loaded suite
    assert result.timed_out and "started" in result.stdout
    survivors = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    survivors.append(pid)
        except OSError:
            continue
    assert not survivors  # the detached grandchild died with the sandbox's PID namespace


def test_filesystem_is_read_only_outside_a_fresh_temp_dir():
    first = sandboxed("import os\nopen('note.txt', 'w').write('hi')\nprint(os.getcwd())\n"
                      "for p in ['/tmp/escape.txt', os.path.expanduser('~') + '/../x', "
                      "'/etc/escape']:\n    try:\n        open(p, 'w')\n        print('WROTE', p)\n"
                      "    except OSError as e:\n        print('denied', e.errno)\n")
    assert "WROTE" not in first.stdout and first.stdout.count("denied") == 3
    workdir = first.stdout.splitlines()[0]
    assert not os.path.exists(workdir)  # removed after the run
    second = sandboxed("import os; print(os.listdir('.'))")
    assert "note.txt" not in second.stdout


def test_tool_reports_timeouts_and_big_output_as_typed_errors():
    short = make_env("toolrl/PythonSandbox-v0", limits={"wall_s": 2})
    short.reset(seed=0)
    obs, _, terminated, _, info = short.step(call("run_python", code="import time; time.sleep(60)"))
    assert not terminated and info["errors"][0]["type"] == "timeout"
    short.close()
    # the default wall limit: under a loaded suite a sandboxed interpreter's start alone has
    # taken more than 2 s, and the output check must not race it
    env = make_env("toolrl/PythonSandbox-v0")
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step(call("run_python", code="print('z' * 50_000)"))
    assert info["errors"][0]["type"] == "output_truncated" and not terminated
    obs, _, _, _, info = env.step(call("run_python", code="1/0"))
    assert "ZeroDivisionError" in obs[0]["content"] and "[exit code 1]" in obs[0]["content"]
    env.close()


def test_fails_closed_without_isolation(monkeypatch):
    monkeypatch.setattr(sandbox_env, "isolation_error", lambda: "unshare: Operation not permitted")
    with pytest.raises(SandboxUnavailable, match="refuses to run code without isolation"):
        PythonSandboxEnv()


def test_code_runs_unprivileged_and_cannot_reach_the_host():
    code = ("import ctypes, os\n"
            "print('uid', os.getuid(), 'pid', os.getpid())\n"
            "print('caps', [l.split()[1] for l in open('/proc/self/status')"
            " if l.startswith('CapEff')][0])\n"
            "print('procs', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "print('unshare', libc.unshare(0x40000000))\n")
    first, second = (sandboxed(code) for _ in range(2))
    lines = dict(line.split(" ", 1) for line in first.stdout.splitlines())
    assert lines["uid"].split()[0] != "0" and lines["caps"] == "0000000000000000"
    assert lines["procs"] == "[1]"  # its own PID namespace: no host process is visible
    assert lines["unshare"] == "-1"  # no capabilities to make (or enter) namespaces
    if os.geteuid() == 0:  # each run gets its own uid
        assert first.stdout.split()[1] != second.stdout.split()[1]
