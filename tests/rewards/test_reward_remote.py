"""The `remote` reward against a real HTTP server on loopback (started and stopped here)."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
import toolrl.rewards  # noqa: F401
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolrl.core.trajectory import Trajectory
from toolrl.reward import RewardConfigError, build_reward


class Handler(BaseHTTPRequestHandler):
    """/score: {"score": row.values.a, "components": {"n_msgs": ...}}; /fail500: always 500;
    /flaky: 500 on the first try of each sample id, then OK; /bad400: 400; /garbage: not JSON;
    /number: a bare number."""

    hits: ClassVar[dict[str, int]] = {}

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        key = f"{self.path}:{body['row'].get('id')}"
        Handler.hits[key] = Handler.hits.get(key, 0) + 1
        if self.path == "/fail500" or (self.path == "/flaky" and Handler.hits[key] == 1):
            return self._send(500, b"oops")
        if self.path == "/bad400":
            return self._send(400, b"bad request")
        if self.path == "/garbage":
            return self._send(200, b"<html>")
        if self.path == "/number":
            return self._send(200, b"0.25")
        answer = {"score": body["row"]["values"]["a"],
                  "components": {"n_msgs": len(body["messages"])}, "reason": "ok"}
        return self._send(200, json.dumps(answer).encode())

    def _send(self, status, payload):
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture
def dead_url():
    """A loopback port nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/score"


def trajs(n, prefix="r"):
    return [Trajectory(messages=[{"role": "user", "content": "q"}] * (i + 1),
                       row={"id": f"{prefix}{i}", "values": {"a": i / 10}}) for i in range(n)]


def remote(url, **kw):
    kwargs = {"url": url, "timeout": 2.0, "retries": 2, "backoff": 0.01, **kw}
    return build_reward({"rewards": [{"name": "remote", "kwargs": kwargs, "fallback": -1.0}]})


def test_remote_scores_with_components(server):
    out = remote(f"{server}/score").score(trajs(5))
    assert out.scores == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert out.components["remote/n_msgs"] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert out.errors["remote"] == 0
    assert remote(f"{server}/number").score(trajs(1)).scores == [0.25]


def test_remote_retries_5xx_then_succeeds(server):
    out = remote(f"{server}/flaky").score(trajs(3, prefix="flaky"))
    assert out.scores == pytest.approx([0.0, 0.1, 0.2]) and out.errors["remote"] == 0
    assert all(Handler.hits[f"/flaky:flaky{i}"] == 2 for i in range(3))


def test_remote_500_gives_fallback_and_counted_error(server):
    out = remote(f"{server}/fail500", retries=2).score(trajs(2, prefix="f5"))
    assert out.scores == [-1.0, -1.0] and out.errors["remote"] == 2
    assert "answered 500" in out.failures[0].message
    assert Handler.hits["/fail500:f50"] == 3  # 1 try + 2 retries


def test_remote_4xx_and_garbage_fail_without_retry(server):
    out = remote(f"{server}/bad400").score(trajs(1, prefix="b4"))
    assert out.errors["remote"] == 1 and "answered 400" in out.failures[0].message
    assert Handler.hits["/bad400:b40"] == 1
    out = remote(f"{server}/garbage").score(trajs(1, prefix="g"))
    assert out.errors["remote"] == 1 and out.scores == [-1.0]


def test_remote_server_down_gives_fallback_and_counted_error(dead_url):
    out = remote(dead_url, retries=1).score(trajs(3))
    assert out.scores == [-1.0] * 3 and out.errors["remote"] == 3
    assert out.metrics()["reward/errors/remote"] == 3.0
    assert "ConnectError" in out.failures[0].message


def test_remote_config_is_validated():
    with pytest.raises(RewardConfigError, match="url must be an http"):
        build_reward([{"name": "remote", "kwargs": {"url": "ftp://x"}}])
    with pytest.raises(RewardConfigError, match="Valid kwargs: url"):
        build_reward([{"name": "remote", "kwargs": {"uri": "http://x"}}])


@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=1, max_size=8))
@settings(max_examples=15, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_property_remote_round_trips_scores(server, values):
    batch = [Trajectory(row={"id": f"p{i}", "values": {"a": v}}) for i, v in enumerate(values)]
    out = remote(f"{server}/score").score(batch)
    assert out.scores == pytest.approx(values) and out.errors["remote"] == 0
