"""A small MCP server ("textkit") for toolrl/MCP-v0 and its tests.

Tools: ``word_count``, ``char_count``, ``reverse_text``, ``divide``. A failing tool reports
``ToolError("<ExceptionType>: <message>")`` so the client sees the exception type.

Run over stdio (what MCP-v0 spawns by default): ``python server.py``; over streamable HTTP:
``python server.py --transport http --port 0`` (prints ``listening on <url>``). This file
imports only the MCP SDK, so the subprocess starts fast.
"""

from __future__ import annotations

import argparse
import socket
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("toolrl-textkit", log_level="WARNING")


@server.tool()
def word_count(text: str) -> int:
    """Number of whitespace-separated words in the text."""
    return len(text.split())


@server.tool()
def char_count(text: str, char: str) -> int:
    """How many times a single character occurs in the text."""
    if len(char) != 1:
        raise ToolError(f"ValueError: char must be one character, got {len(char)}")
    return text.count(char)


@server.tool()
def reverse_text(text: str) -> str:
    """The text reversed."""
    return text[::-1]


@server.tool()
def divide(a: float, b: float) -> float:
    """a divided by b."""
    try:
        return a / b
    except ZeroDivisionError as exc:
        raise ToolError(f"ZeroDivisionError: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="toolrl textkit MCP server")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="http only; 0 picks a free port")
    args = parser.parse_args(argv)
    if args.transport == "stdio":
        server.run("stdio")
        return 0
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(128)
    print(f"listening on http://{args.host}:{sock.getsockname()[1]}/mcp", flush=True)
    app = server.streamable_http_app(host=args.host)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
