"""An MCP server (stdio or streamable HTTP) whose tools misbehave on request, for fault tests.

Tools: ``echo(text)``; ``crash()`` kills the server process in the middle of the call;
``sleep(seconds)`` answers late; ``pid()`` is the server's pid; ``count()`` counts its calls
(state that lives as long as the server process); ``spawn_child()`` starts a grandchild
(``sleep 600``) and returns its pid. Run: ``python mcp_fault_server.py [--transport http
--port 0] [--tag T] [--hang-on-exit]`` (over HTTP it prints ``listening on <url>``);
``--hang-on-exit``: when stdin closes, ignore SIGTERM and never exit (a server that ignores
the polite shutdown).
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import socket
import subprocess
import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("toolrl-fault-server", log_level="WARNING")


@server.tool()
def echo(text: str) -> str:
    """The text, unchanged."""
    return text


@server.tool()
def crash() -> str:
    """Kill the server process while this call is in flight."""
    os._exit(17)


@server.tool()
def sleep(seconds: float) -> str:
    """Answer after ``seconds``."""
    time.sleep(seconds)
    return "slept"


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


_calls = itertools.count(1)


@server.tool()
def count() -> int:
    """How many times count() was called on this server process."""
    return next(_calls)


@server.tool()
def spawn_child() -> int:
    """Start a grandchild process that sleeps for 10 minutes; its pid."""
    return subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL).pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="toolrl fault-test MCP server")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tag", default="", help="ignored; lets a test find this process")
    parser.add_argument("--hang-on-exit", action="store_true")
    args = parser.parse_args(argv)
    if args.transport == "stdio":
        server.run("stdio")
        if args.hang_on_exit:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(600)
        return 0
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(16)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
    app = server.streamable_http_app(host="127.0.0.1")
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
