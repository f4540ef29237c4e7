"""The loopback bootstrap guard."""

from __future__ import annotations

import ipaddress

import pytest

from toolrl.controller import apply_loopback_guard, is_self_routable, outbound_ip


def _never_probe() -> bool:
    raise AssertionError("the probe must not run when the variables are already set")


def test_unroutable_host_gets_loopback_for_nccl_and_gloo():
    env: dict[str, str] = {}
    changed = apply_loopback_guard(env, probe=lambda: False)
    assert env == changed == {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}


def test_routable_host_is_left_alone():
    env: dict[str, str] = {}
    assert apply_loopback_guard(env, probe=lambda: True) == {} and env == {}


def test_existing_values_are_kept_and_the_probe_is_skipped_when_all_are_set():
    env = {"NCCL_SOCKET_IFNAME": "ib0"}
    assert apply_loopback_guard(env, probe=lambda: False) == {"GLOO_SOCKET_IFNAME": "lo"}
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"
    env = {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "eth0"}
    assert apply_loopback_guard(env, probe=_never_probe) == {}


def test_real_probe_on_this_host():
    own = outbound_ip()
    ipaddress.ip_address(own)
    assert is_self_routable("127.0.0.1")
    # A documentation address (RFC 5737) that is not this host's: unreachable or refused.
    other = next(ip for ip in ("203.0.113.1", "198.51.100.1", "192.0.2.1") if ip != own)
    assert not is_self_routable(other, timeout_s=0.3)


@pytest.mark.parametrize("routable", [True, False])
def test_guard_with_the_default_probe_sets_variables_only_when_needed(monkeypatch, routable):
    monkeypatch.setattr("toolrl.controller.network.is_self_routable", lambda ip: routable)
    env: dict[str, str] = {}
    apply_loopback_guard(env)
    assert bool(env) is (not routable)
