"""`init_ray`: start a local cluster or connect to ``RAY_ADDRESS``.

The decision logic is checked here with ``ray.init`` recorded (the session already runs Ray,
and a second local start costs ~20 s); the connect path runs for real against a two-node
cluster in test_resource_pools.py, and every group test runs workers that import toolrl.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import ray

from toolrl.controller import cluster, default_temp_dir, init_ray


@pytest.fixture
def recorded_init(monkeypatch):
    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw) or "ctx")
    for var in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cluster, "apply_loopback_guard", lambda: {})
    # init_ray marks the cluster as its own (shutdown_ray then stops it); restored afterwards, or
    # the next trainer run would stop the session's real cluster as if it had started it
    monkeypatch.setattr(cluster, "_started_local", False)
    return calls


def test_local_cluster_is_sized_by_arguments_with_auth_off_and_a_short_temp_dir(
        recorded_init):
    assert init_ray(num_cpus=3, num_gpus=0) == "ctx"
    (kwargs,) = recorded_init
    assert kwargs["num_cpus"] == 3 and kwargs["num_gpus"] == 0
    assert kwargs["include_dashboard"] is False and "address" not in kwargs
    assert kwargs["_temp_dir"] == default_temp_dir()
    assert default_temp_dir().startswith(tempfile.gettempdir()) and len(default_temp_dir()) < 60
    assert os.environ["RAY_AUTH_MODE"] == "disabled"
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0"
    assert "_node_ip_address" not in kwargs and "runtime_env" not in kwargs


def test_ray_address_means_connect_and_an_empty_one_means_start(recorded_init, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    init_ray(num_cpus=3)
    assert recorded_init[-1] == {"address": "10.1.2.3:6379", "log_to_driver": False}
    monkeypatch.setenv("RAY_ADDRESS", "")  # Ray would treat "" as an address and hang
    init_ray(num_cpus=3)
    assert "address" not in recorded_init[-1] and recorded_init[-1]["num_cpus"] == 3
    assert "RAY_ADDRESS" not in os.environ


def test_unroutable_host_keeps_ray_on_loopback(recorded_init, monkeypatch):
    monkeypatch.setattr(cluster, "apply_loopback_guard", lambda: {"NCCL_SOCKET_IFNAME": "lo"})
    init_ray(num_cpus=1)
    assert recorded_init[-1]["_node_ip_address"] == "127.0.0.1"


def test_init_ray_is_a_no_op_when_ray_is_running(ray_cluster):
    assert init_ray(num_cpus=1) is None
    assert ray_cluster.cluster_resources()["CPU"] != 1
