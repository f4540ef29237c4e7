"""Fixtures that start real servers on loopback in a subprocess and stop them afterwards."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest


def start_server(args: list[str], timeout: float = 60.0) -> tuple[subprocess.Popen, str]:
    """Start ``python args...``; wait (bounded) for its ``listening on URL`` line."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if selector.select(timeout=max(0.0, deadline - time.monotonic())):
                line = proc.stdout.readline()
                if line.startswith("listening on "):
                    return proc, line.split("listening on ", 1)[1].strip()
                if not line and proc.poll() is not None:
                    break
        raise RuntimeError(f"server {args} did not start within {timeout} s")
    except BaseException:
        stop_server(proc)
        raise
    finally:
        selector.close()


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if proc.stdout:
        proc.stdout.close()


@pytest.fixture(scope="module")
def store_url() -> Iterator[str]:
    """The HttpApi store service (uvicorn) on 127.0.0.1, a free port, for this module."""
    proc, url = start_server(["-m", "toolrl.envs.http_api.service", "--port", "0"])
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def mcp_http_url() -> Iterator[str]:
    """The textkit MCP server over streamable HTTP on 127.0.0.1, for this module."""
    from toolrl.envs.mcp.env import SERVER_SCRIPT

    proc, url = start_server([str(SERVER_SCRIPT), "--transport", "http", "--port", "0"])
    try:
        yield url
    finally:
        stop_server(proc)
