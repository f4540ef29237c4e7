"""The bootstrap interface guard: pin NCCL/Gloo to loopback on hosts that cannot reach themselves.

torch.distributed has three network layers that each pick an interface on their own: the
TCPStore (at MASTER_ADDR), Gloo, and NCCL's bootstrap (which enumerates interfaces and never
reads MASTER_ADDR). On a host whose own outbound IP does not route back to itself (a bonded or
VLAN-isolated NIC), NCCL's first collective then hangs with no error. Pinning
``NCCL_SOCKET_IFNAME=lo`` and ``GLOO_SOCKET_IFNAME=lo`` fixes the bootstrap on a single node and
leaves the data path (NVLink, InfiniBand) alone.

`apply_loopback_guard` must run before Ray starts, so every worker inherits the variables. It
never overrides a variable that is already set (a multi-node run points them at a routable
interface), and it skips the probe entirely when all are set: the probe can cost its timeout.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, MutableMapping

ROUTING_VARS: tuple[str, ...] = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
LOOPBACK_IFNAME = "lo"
LOOPBACK_IP = "127.0.0.1"


def outbound_ip() -> str:
    """The IP this host would use to reach other machines (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # UDP connect only picks a route
            return str(s.getsockname()[0])
    except OSError:
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return LOOPBACK_IP


def is_self_routable(ip: str, timeout_s: float = 1.0) -> bool:
    """Whether a TCP connection from this host to ``ip`` reaches a listener on this host."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("0.0.0.0", 0))
            server.listen(1)
            port = server.getsockname()[1]
            with socket.create_connection((ip, port), timeout=timeout_s):
                return True
    except OSError:
        return False


def apply_loopback_guard(
    environ: MutableMapping[str, str] | None = None,
    probe: Callable[[], bool] | None = None,
) -> dict[str, str]:
    """Set the routing variables to ``lo`` when the host's IP is not self-routable.

    Args:
        environ: the environment to edit (``os.environ`` by default).
        probe: returns True when the host's own IP routes to itself; by default a TCP probe of
            `outbound_ip`. Not called at all when every variable is already set.

    Returns:
        The variables this call set (empty when nothing changed).
    """
    env = os.environ if environ is None else environ
    if all(var in env for var in ROUTING_VARS):
        return {}
    routable = probe() if probe is not None else is_self_routable(outbound_ip())
    if routable:
        return {}
    changed = {var: LOOPBACK_IFNAME for var in ROUTING_VARS if var not in env}
    env.update(changed)
    return changed


def free_port(host: str = "") -> int:
    """A TCP port that was free a moment ago (the usual bind-to-0 trick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
