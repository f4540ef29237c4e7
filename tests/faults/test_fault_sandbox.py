"""Sandbox escapes (toolrl/PythonSandbox-v0): code run through the env's ``run_python`` tool
tries to get out, and fails.

Every attempt is one episode: turn 1 runs the escape, turn 2 runs ``print(6 * 7)`` (the sandbox
still works), turn 3 submits. All episodes run at once as one batch (counted in and out); each
test below checks one escape. The test plants what an escape would reach: a world-readable
canary file in a world-writable directory outside the sandbox, a TCP server on 127.0.0.1, and
a secret-looking environment variable.

Limits used: 1 s CPU, 256 MiB address space, 8 processes, 6 s wall clock, 4 KiB output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import tempfile
import threading
import uuid
from pathlib import Path

import pytest
from fault_harness import call, play_batch

from toolrl.core.registration import make_env

pytestmark = pytest.mark.timeout(180)
LIMITS = {"cpu_s": 1, "memory_bytes": 256 << 20, "processes": 8, "wall_s": 6.0,
          "max_output_bytes": 4096}
MARKER = uuid.uuid4().hex  # in every escape's command line: survivors are easy to find

ESCAPES = {
    "read_outside": """
for path in [CANARY, CANARY_DIR, PROJECT_FILE, os.path.dirname(PROJECT_FILE), "/home"]:
    try:
        print(path, open(path).read() if path != CANARY_DIR else sorted(os.listdir(path)))
    except OSError as e:
        print(path, "blocked", type(e).__name__)
""",
    "write_outside": """
for path in [CANARY_DIR + "/planted.txt", "/tmp/planted-" + MARKER, CANARY]:
    try:
        with open(path, "a") as f:
            f.write("pwned")
        print("WROTE", path)
    except OSError as e:
        print(path, "blocked", type(e).__name__)
""",
    "subprocess": """
import subprocess
out = subprocess.run(["/bin/sh", "-c", "cat " + CANARY + "; echo pwned > " + CANARY_DIR
                      + "/sh.txt; id -u; echo done"], capture_output=True, text=True)
print("rc", out.returncode, "stdout", out.stdout.split(), "stderr", out.stderr.strip()[:200])
""",
    "socket": """
import socket
for family, kind in [(socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM)]:
    try:
        s = socket.socket(family, kind)
        s.settimeout(2)
        s.connect(("127.0.0.1", PORT))
        s.sendall(b"hello from the sandbox")
        print("CONNECTED", kind)
    except OSError as e:
        print("blocked", kind, type(e).__name__)
""",
    "memory": """
hog = []
try:
    while True:
        hog.append(bytearray(16 << 20))
except MemoryError:
    print("MemoryError after", len(hog) * 16, "MiB")
""",
    "fork_bomb": """
import sys, time
BOMB = "import os, time\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n"
BOMB += "        time.sleep(0.01)\\n"
forked = 0
try:
    while True:
        if os.fork() == 0:  # every child forks on, forever (MARKER in its command line)
            os.execv(sys.executable, [sys.executable, "-c", BOMB, MARKER])
        forked += 1
except OSError as e:
    print("fork refused after", forked, type(e).__name__, flush=True)
time.sleep(1)  # the bomb keeps trying meanwhile
print("still responsive")  # then this PID 1 exits and the kernel reaps the namespace
""",
    "infinite_loop": "while True:\n    pass\n",
    "sleep_forever": "import time\nprint('sleeping', flush=True)\ntime.sleep(10_000)\n",
    "output_flood": "while True:\n    print('x' * 1000)\n",
    "env_secrets": "print(sorted(os.environ.items()))\n",
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A world-readable canary in a world-writable dir, a TCP server recording connections,
    and a secret-looking environment variable."""
    canary_dir = Path(tempfile.mkdtemp(prefix="toolrl-canary-"))
    canary_dir.chmod(0o777)
    canary = canary_dir / "canary.txt"
    secret = f"canary-{uuid.uuid4().hex}"
    canary.write_text(secret)
    canary.chmod(0o644)
    server = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", server.getsockname()[1]))
    udp.settimeout(0.1)
    received: list[object] = []
    stop = threading.Event()

    def listen() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            for receive in (server.accept, lambda: udp.recvfrom(1024)):
                with contextlib.suppress(OSError):  # nothing arrived within the timeout
                    received.append(receive())

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    os.environ["TOOLRL_FAULT_TEST_API_KEY"] = secret
    try:
        yield {"dir": canary_dir, "canary": canary, "secret": secret,
               "port": server.getsockname()[1], "received": received}
    finally:
        os.environ.pop("TOOLRL_FAULT_TEST_API_KEY", None)
        stop.set()
        thread.join(5)
        server.close()
        udp.close()
        shutil.rmtree(canary_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def runs(planted):
    """Play every escape (plus a healthy task) as one batch; returns {name: outputs}."""
    prelude = (f"import os\nCANARY = {str(planted['canary'])!r}\n"
               f"CANARY_DIR = {str(planted['dir'])!r}\nPORT = {planted['port']}\n"
               f"MARKER = {MARKER!r}\nPROJECT_FILE = {__file__!r}\n")
    rows = [{"id": name, "question": "escape", "ground_truth": 42,
             "code": prelude + code} for name, code in ESCAPES.items()]
    rows.append({"id": "healthy", "question": "6 * 7?", "ground_truth": 42,
                 "code": "print(6 * 7)"})

    def policy(env, messages):
        row, turn = env.unwrapped.row, env.unwrapped.turn
        return [call("run_python", code=row["code"]), call("run_python", code="print(6 * 7)"),
                call("submit", answer=42)][turn]

    episodes = asyncio.run(play_batch(
        lambda: make_env("toolrl/PythonSandbox-v0", limits=LIMITS, tool_timeout=60), rows,
        policy, timeout=150))
    out = {}
    for name, ep in episodes.items():
        tools = [m["content"] for m in ep.messages if m["role"] == "tool"]
        errors = [[e["type"] for e in t.errors] for t in ep.turns]
        # after every escape attempt the sandbox still runs code and the episode ends
        assert tools[1] == "42\n" and errors[1:] == [[], []], (name, tools, errors)
        assert ep.finish_reason == "terminated" and ep.success, name
        out[name] = {"output": tools[0], "errors": errors[0]}
    assert set(out) == {*ESCAPES, "healthy"}
    return out


def test_healthy_code_runs(runs):
    assert runs["healthy"] == {"output": "42\n", "errors": []}


def test_reading_a_file_outside_the_sandbox_fails(runs, planted):
    output = runs["read_outside"]["output"]
    assert planted["secret"] not in output
    # not even visible: this test file, its directory, other dirs of the host
    assert output.count("blocked FileNotFoundError") == 5, output


def test_writing_outside_the_sandbox_fails(runs, planted):
    output = runs["write_outside"]["output"]
    assert "WROTE" not in output and output.count("blocked") == 3, output
    assert sorted(p.name for p in planted["dir"].iterdir()) == ["canary.txt"]
    assert planted["canary"].read_text() == planted["secret"]
    assert not Path(f"/tmp/planted-{MARKER}").exists()


def test_a_subprocess_stays_inside_the_sandbox(runs, planted):
    """Spawning works, but the child has the same view and limits: no canary, no write."""
    output = runs["subprocess"]["output"]
    assert planted["secret"] not in output and "done" in output, output
    assert "canary.txt: No such file" in output
    uid = json.loads(output.split("stdout ", 1)[1].split(" stderr", 1)[0].replace("'", '"'))[0]
    assert uid != "0"
    assert not (planted["dir"] / "sh.txt").exists()


def test_a_socket_to_a_loopback_server_fails(runs, planted):
    output = runs["socket"]["output"]
    assert "CONNECTED" not in output and output.count("blocked") == 2, output
    assert planted["received"] == []  # the server saw no connection and no datagram


def test_exhausting_memory_fails_inside_the_sandbox(runs):
    output = runs["memory"]["output"]
    assert "MemoryError after" in output
    assert int(output.split("after ")[1].split()[0]) <= 256


def test_a_fork_bomb_is_bounded_by_the_process_limit(runs):
    """Forks are refused at the process limit, the sandbox stays responsive, and when its
    main process exits the kernel kills every process of the sandbox's PID namespace."""
    result = runs["fork_bomb"]
    assert result["errors"] == [] and "still responsive" in result["output"], result
    forked = int(result["output"].split("fork refused after ")[1].split()[0])
    assert forked < LIMITS["processes"]
    survivors = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if MARKER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                survivors.append(pid)
        except OSError:
            continue
    assert not survivors


def test_an_infinite_loop_hits_the_cpu_limit(runs):
    """Killed at the CPU-time limit (or at the wall clock, on a machine too busy for the loop
    to use 2 s of CPU within 6 s)."""
    result = runs["infinite_loop"]
    assert "(CPU time limit)" in result["output"] or result["errors"] == ["timeout"] or \
        "(killed: CPU or memory limit)" in result["output"], result


def test_sleeping_forever_hits_the_wall_clock(runs):
    result = runs["sleep_forever"]
    assert result["errors"] == ["timeout"]
    assert "longer than 6 s and was killed" in result["output"]


def test_flooding_output_hits_the_output_cap(runs):
    result = runs["output_flood"]
    assert "[output over 4096 bytes: the program was killed]" in result["output"] or \
        result["errors"] == ["output_truncated"]
    assert len(result["output"]) <= 2100  # the env's cap on what the model sees


def test_environment_secrets_do_not_reach_the_code(runs, planted):
    output = runs["env_secrets"]["output"]
    assert planted["secret"] not in output and "TOOLRL_FAULT_TEST_API_KEY" not in output
    assert "'HOME'" in output  # the sandbox's own, whitelisted environment
