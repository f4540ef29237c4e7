"""Fault table, tool servers: timeouts that hold exactly, and no process left behind.

- connect: an MCP server that never answers (stdio, or an HTTP endpoint that accepts and stays
  silent) raises ``ConnectionError`` at ``connect_timeout``, not later; an HTTP tool whose
  service never completes the TCP handshake is a ``timeout`` at ``connect_timeout``;
- per call: a slow MCP tool is a ``timeout`` at ``tool_timeout``, and the shared session (and
  the other episodes on it) keep working;
- shutdown: closing a session whose server ignores stdin's end and SIGTERM returns within
  ``shutdown_timeout`` plus the kill, with the server's whole process group gone;
- no orphans: a driver process that is SIGKILLed, or exits without closing anything, leaves
  none of the processes it started (MCP server, the server's own child, a sandbox run);
- sharing: concurrent episodes of one process share one MCP server (``session="shared"``), or
  get their own (``session="episode"``, for stateful servers); a crashed shared server is
  restarted for the next episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from fault_harness import call, play_batch

from toolrl.core.mcp_client import MCPConnection, close_mcp_connections, shared_mcp_connection
from toolrl.core.registration import make_env

pytestmark = pytest.mark.timeout(180)
MCP_ENV, HTTP_ENV = "toolrl/MCP-v0", "toolrl/HttpApi-v0"
FAULT_SERVER = str(Path(__file__).with_name("mcp_fault_server.py"))
SILENT = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
MCP_ROW = {"question": "Call the tools, then submit x.", "ground_truth": "x"}
SLACK = 1.0  # what "exact" allows on a loaded 2-core machine
KILL = 2.0  # `MCPConnection.close` returns within shutdown_timeout + this


@pytest.fixture(autouse=True)
def no_shared_sessions():
    """Each test starts and ends without shared MCP sessions in this process."""
    close_mcp_connections()
    yield
    close_mcp_connections()


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids, timeout: float = 10.0) -> list[int]:
    """Poll until none of ``pids`` runs; the survivors after ``timeout`` s (killed then)."""
    deadline = time.monotonic() + timeout
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:  # never leave them behind, even when the test fails
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def descendants(pid: int | None = None) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def tagged(tag: str) -> list[int]:
    """This process's descendants whose command line holds ``tag``."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if tag in " ".join(proc.cmdline()):
                out.append(proc.pid)
        except psutil.Error:
            pass
    return out


def fault_server(*extra: str) -> list[str]:
    return [sys.executable, FAULT_SERVER, *extra]


def outputs(ep) -> list[str]:
    return [m["content"] for m in ep.messages if m["role"] == "tool"]


def kinds(ep) -> list[list[str]]:
    return [[e["type"] for e in t.errors] for t in ep.turns]


def scripted(script):
    def policy(env, messages):
        return script[env.unwrapped.turn]

    return policy


# --- connect -------------------------------------------------------------------------------
def test_mcp_stdio_connect_timeout_is_exact_and_kills_the_server():
    tag = f"silent-{os.getpid()}-{time.monotonic_ns()}"
    env = make_env(MCP_ENV, command=[sys.executable, "-c", f"{SILENT}  # {tag}"],
                   connect_timeout=2.0, shutdown_timeout=1.0)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=r"no answer within 2\.0 s"):
        env.reset(seed=0)
    took = time.monotonic() - start
    assert 2.0 <= took <= 2.0 + SLACK, took
    env.close()
    close_mcp_connections()  # the failed session's teardown: bounded, then nothing is left
    assert time.monotonic() - start <= 2.0 + 1.0 + KILL + SLACK
    assert tagged(tag) == []


def test_mcp_shared_connect_failure_is_not_retried_by_every_episode():
    """While a connect failed less than ``retry_after`` s ago, the next episodes fail at once
    (a worker's 64 episodes do not each wait ``connect_timeout``)."""
    command = [sys.executable, "-c", SILENT]
    with pytest.raises(ConnectionError):
        shared_mcp_connection(command, connect_timeout=1.0, shutdown_timeout=0.5)
    start = time.monotonic()
    for _ in range(5):
        with pytest.raises(ConnectionError, match=r"failed .* ago"):
            shared_mcp_connection(command, connect_timeout=1.0)
    assert time.monotonic() - start < 0.5


@pytest.fixture
def silent_http():
    """An HTTP endpoint that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    held: list[socket.socket] = []
    yield server, held, f"http://127.0.0.1:{server.getsockname()[1]}/mcp"
    for conn in held:
        conn.close()
    server.close()


def test_mcp_http_connect_timeout_is_exact(silent_http):
    server, held, url = silent_http
    conn = MCPConnection(url, connect_timeout=1.5, shutdown_timeout=1.0)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=r"no answer within 1\.5 s"):
        conn.open()
    took = time.monotonic() - start
    assert 1.5 <= took <= 1.5 + SLACK, took
    with pytest.raises(TimeoutError):  # the client really connected and was left waiting
        while True:
            held.append(server.accept()[0])
    assert held
    conn.close()
    assert time.monotonic() - start <= 1.5 + 1.0 + KILL + SLACK


@pytest.fixture
def full_backlog():
    """A listening port whose accept queue is full: connects hang in the TCP handshake."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(3):
        sock = socket.socket()
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(("127.0.0.1", port))
        fillers.append(sock)
    time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    for sock in fillers:
        sock.close()
    server.close()


@pytest.mark.parametrize("retries", [0, 2])
def test_http_tool_connect_timeout_is_exact(full_backlog, retries):
    """HttpApi-v0: each connection attempt gets ``connect_timeout``; the call as a whole never
    exceeds ``tool_timeout`` (here 5 attempts would take longer than it)."""
    env = make_env(HTTP_ENV, base_url=full_backlog, connect_timeout=0.5, retries=retries,
                   tool_timeout=1.2)
    try:
        env.reset(seed=0)
        start = time.monotonic()
        _, _, _, _, info = env.step(call("list_orders"))
        took = time.monotonic() - start
    finally:
        env.close()
    assert [e["type"] for e in info["errors"]] == ["timeout"]
    if retries == 0:
        assert "ConnectTimeout" in info["errors"][0]["message"]
        assert 0.5 <= took <= 0.5 + SLACK, took
    else:
        assert 1.2 <= took <= 1.2 + SLACK, took


# --- calls ---------------------------------------------------------------------------------
def test_mcp_call_timeout_is_exact_and_the_shared_session_survives():
    """Two concurrent episodes on one shared server: one calls a tool that takes 30 s with
    ``tool_timeout=2``; its call times out at 2 s, the other episode's calls are not held
    up, and the same session answers the next calls."""
    rows = [dict(MCP_ROW, id="slow"), dict(MCP_ROW, id="quick")]
    scripts = {"slow": [call("sleep", seconds=30), call("echo", text="after"),
                        call("submit", answer="x")],
               "quick": [call("echo", text="a"), call("echo", text="b"),
                         call("submit", answer="x")]}

    def policy(env, messages):
        return scripts[env.unwrapped.row["id"]][env.unwrapped.turn]

    start = time.monotonic()
    episodes = asyncio.run(play_batch(
        lambda: make_env(MCP_ENV, command=fault_server(), tool_timeout=2.0), rows, policy,
        timeout=90))
    slow, quick = episodes["slow"], episodes["quick"]
    assert kinds(slow) == [["timeout"], [], []] and slow.success
    assert 2.0 <= slow.turns[0].env_s <= 2.0 + SLACK, slow.turns[0].env_s
    assert outputs(slow)[1] == "after"
    assert kinds(quick) == [[], [], []] and outputs(quick)[:2] == ["a", "b"] and quick.success
    assert quick.turns[0].env_s < 2.0
    assert time.monotonic() - start < 30 + 60  # the slow call was not waited for (connect: 60)


# --- shutdown ------------------------------------------------------------------------------
def test_close_kills_a_server_that_ignores_shutdown_and_its_children():
    before = set(descendants())  # e.g. an in-process Ray another test file started
    conn = MCPConnection(fault_server("--hang-on-exit"), connect_timeout=60,
                         shutdown_timeout=1.0)
    conn.open()
    result = asyncio.run(conn.call_tool("spawn_child", {}, timeout=30))
    grandchild = int(result.content[0].text)
    group = [p for p in descendants() if p not in before]
    assert conn.pgid in group and grandchild in group and len(group) >= 3
    start = time.monotonic()
    conn.close()
    took = time.monotonic() - start
    assert took <= 1.0 + KILL + SLACK, took
    assert alive(group) == [], [psutil.Process(p).cmdline() for p in alive(group)]


def test_closing_an_episode_session_ends_its_server():
    env = make_env(MCP_ENV, command=fault_server(), session="episode")
    env.reset(options=dict(MCP_ROW, id="own"))
    _, _, _, _, info = env.step(call("pid"))
    server = int(env.unwrapped.messages[-1]["content"])
    assert not info["errors"] and server in descendants()
    env.close()
    assert alive([server]) == []


# --- no orphans ----------------------------------------------------------------------------
DRIVER = """
import asyncio, json, sys, threading, time
from toolrl import shared_mcp_connection
from toolrl.envs.python_sandbox.sandbox import Limits, run_python

conn = shared_mcp_connection({server!r}, connect_timeout=60, shutdown_timeout=1.0)
grandchild = asyncio.run(conn.call_tool("spawn_child", {{}}, timeout=30)).content[0].text
threading.Thread(target=lambda: asyncio.run(run_python(
    "import time; time.sleep(600)", Limits(wall_s=600, cpu_s=600))), daemon=True).start()
time.sleep(1.0)  # the sandbox has started
print(json.dumps({{"grandchild": int(grandchild)}}), flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)  # without closing anything
time.sleep(600)
"""


@pytest.mark.parametrize("end", ["sigkill", "exit"])
def test_a_dead_driver_leaves_no_process(tmp_path, end):
    """The driver starts an MCP server (that ignores the polite shutdown and has a child of
    its own) and a sandbox run that sleeps for 10 minutes; then it is SIGKILLed, or exits
    without closing anything. Every process it started is gone soon after."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER.format(server=fault_server("--hang-on-exit"))))
    driver = subprocess.Popen([sys.executable, str(script), end], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    started: list[int] = []
    try:
        line = driver.stdout.readline()
        assert line, "the driver did not start"
        grandchild = json.loads(line)["grandchild"]
        started = descendants(driver.pid)
        names = " ".join(" ".join(psutil.Process(p).cmdline()) for p in started)
        assert grandchild in started and "watchdog.py" in names and "launcher.py" in names
        assert "mcp_fault_server.py" in names
        if end == "sigkill":
            driver.send_signal(signal.SIGKILL)
        assert driver.wait(timeout=30) == (-signal.SIGKILL if end == "sigkill" else 0)
        assert wait_gone(started, timeout=10) == []
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        driver.stdout.close()
        wait_gone(started, timeout=0)


# --- sharing -------------------------------------------------------------------------------
def test_concurrent_episodes_share_one_server():
    rows = [dict(MCP_ROW, id=f"share-{i}") for i in range(8)]
    script = [call("pid"), call("submit", answer="x")]
    before = set(descendants())
    episodes = asyncio.run(play_batch(
        lambda: make_env(MCP_ENV, command=fault_server()), rows, scripted(script), timeout=90))
    pids = {outputs(ep)[0] for ep in episodes.values()}
    assert len(pids) == 1 and all(ep.success for ep in episodes.values())
    servers = set(descendants()) - before
    assert int(pids.pop()) in servers and len(servers) == 3  # watchdog, its reaper, server
    close_mcp_connections()
    assert alive(servers) == []


@pytest.mark.parametrize("session", ["shared", "episode"])
def test_stateful_server_sessions(session):
    """``count()`` keeps state in the server: shared episodes see each other's calls, an
    episode with a session of its own starts from a fresh server."""
    rows = [dict(MCP_ROW, id=f"{session}-{i}") for i in range(4)]
    script = [call("count"), call("submit", answer="x")]
    counts = []
    for row in rows:  # one after the other, so the shared counts are 1, 2, 3, 4
        episodes = asyncio.run(play_batch(
            lambda: make_env(MCP_ENV, command=fault_server(), session=session), [row],
            scripted(script), timeout=60))
        counts.append(int(outputs(episodes[row["id"]])[0]))
    assert counts == ([1, 2, 3, 4] if session == "shared" else [1, 1, 1, 1])


def test_a_crashed_shared_server_is_restarted_for_the_next_episode():
    first = [call("pid"), call("crash"), call("echo", text="again"), call("submit", answer="x")]
    ep1 = asyncio.run(play_batch(lambda: make_env(MCP_ENV, command=fault_server()),
                                 [dict(MCP_ROW, id="crash")], scripted(first), timeout=60))["crash"]
    assert kinds(ep1) == [[], ["tool_exception"], ["tool_exception"], []] and ep1.success
    assert "Connection closed" in outputs(ep1)[1]
    second = [call("pid"), call("submit", answer="x")]
    ep2 = asyncio.run(play_batch(lambda: make_env(MCP_ENV, command=fault_server()),
                                 [dict(MCP_ROW, id="next")], scripted(second),
                                 timeout=60))["next"]
    assert kinds(ep2) == [[], []] and ep2.success
    assert outputs(ep2)[0] != outputs(ep1)[0]  # a new server process



def server_holder_class():
    """A Ray actor class that holds a shared MCP session, as a rollout worker's episodes do
    (defined here so that Ray ships it by value: workers cannot import this test module)."""

    class ServerHolder:
        def start(self, command: list[str]) -> list[int]:
            import asyncio
            import os

            import psutil

            from toolrl import shared_mcp_connection

            conn = shared_mcp_connection(command, connect_timeout=60, shutdown_timeout=1.0)
            asyncio.run(conn.call_tool("spawn_child", {}, timeout=30))
            return [os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))]

        def leave(self) -> None:
            import ray

            ray.actor.exit_actor()  # a graceful worker exit: nothing closed explicitly

    return ServerHolder


@pytest.mark.parametrize("end", ["ray.kill", "exit_actor"])
def test_a_ray_worker_that_dies_leaves_no_process(ray_cluster, end):
    ray = ray_cluster
    actor = ray.remote(num_cpus=0)(server_holder_class()).remote()
    worker, *started = ray.get(actor.start.remote(fault_server("--hang-on-exit")), timeout=120)
    try:
        assert len(started) >= 4  # the watchdog, its reaper, the server and its child
        if end == "ray.kill":
            ray.kill(actor, no_restart=True)
        else:
            with contextlib.suppress(ray.exceptions.RayActorError):
                ray.get(actor.leave.remote(), timeout=60)
        assert wait_gone([worker], timeout=30) == []
        assert wait_gone(started, timeout=10) == []
    finally:
        wait_gone([worker, *started], timeout=0)
