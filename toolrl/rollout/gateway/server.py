"""`GatewayServer`: a `Gateway`'s app served by uvicorn on loopback, on a daemon thread."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

__all__ = ["GatewayServer"]


class GatewayServer:
    """Serve ``gateway.app`` on ``host:port`` (0: a free port) until `stop`.

    ``url`` is the server's root; `episode_url` the OpenAI base URL of one episode's route,
    `anthropic_url` the Anthropic one.
    ``keep_alive_s``: how long an idle client connection stays open. Make it longer than an
    episode: a server that closes an idle connection just as the client sends its next request
    on it fails that request (uvicorn's default, 5 s, did for agents whose tools took ~5 s).
    """

    def __init__(self, gateway: Any, host: str = "127.0.0.1", port: int = 0,
                 keep_alive_s: float = 3600.0) -> None:
        self.gateway = gateway
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(512)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(gateway.app, log_level="warning",
                                                    lifespan="off", access_log=False,
                                                    timeout_keep_alive=keep_alive_s))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="toolrl-gateway", daemon=True)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of plain (uncaptured) calls."""
        return f"{self.url}/v1"

    def episode_url(self, episode_id: str) -> str:
        """The OpenAI base URL of one episode's route."""
        return f"{self.url}/episodes/{episode_id}/v1"

    def anthropic_url(self, episode_id: str | None = None) -> str:
        """The Anthropic base URL (its SDK adds ``/v1/messages``) of one episode's route, or
        of plain calls."""
        return self.url if episode_id is None else f"{self.url}/episodes/{episode_id}"

    def start(self, timeout: float = 20.0) -> GatewayServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started and time.monotonic() < deadline and \
                self.thread.is_alive():
            time.sleep(0.02)
        if not self.server.started:
            self.stop()
            raise RuntimeError(f"the gateway did not start within {timeout} s")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving (idempotent)."""
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
