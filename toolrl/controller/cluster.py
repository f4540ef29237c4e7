"""Start or join the Ray cluster the controller runs on.

`init_ray` is the embedded default: without an address it starts a local cluster sized by its
arguments (token auth off, usage stats off, a short session dir under the system temp dir);
with ``address=`` or ``RAY_ADDRESS`` set it connects to that existing cluster. The loopback
guard of `toolrl.controller.network` runs first, so Ray and every worker inherit its variables.
Worker processes use the driver's interpreter, so an installed (or editable) toolrl imports
there as it does in the driver; no ``runtime_env`` working_dir is shipped.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import ray

from toolrl.controller.network import LOOPBACK_IP, apply_loopback_guard


def default_temp_dir() -> str:
    """A short per-process session dir (Ray's socket paths have a length limit)."""
    return str(Path(tempfile.gettempdir()) / f"ray-toolrl-{os.getpid()}")


def init_ray(num_cpus: int | None = None, num_gpus: int | None = None, *,
             address: str | None = None, temp_dir: str | None = None,
             log_to_driver: bool = False, **ray_kwargs: Any) -> Any:
    """Connect to ``address`` / ``RAY_ADDRESS``, or start a local cluster; no-op if connected.

    Args:
        num_cpus, num_gpus: size of a local cluster (ignored when connecting).
        address: an existing cluster ("auto", "ray://host:port", "host:port").
        temp_dir: session dir of a local cluster (default: `default_temp_dir`).
        log_to_driver: forward worker stdout/stderr to this process.
        **ray_kwargs: passed to ``ray.init``.

    Returns:
        Ray's context object (None when Ray was already initialised).
    """
    if ray.is_initialized():
        return None
    if os.environ.get("RAY_ADDRESS") == "":
        del os.environ["RAY_ADDRESS"]  # Ray reads "" as an address and hangs trying it
    address = address or os.environ.get("RAY_ADDRESS")
    pinned = apply_loopback_guard()
    if address:
        return ray.init(address=address, log_to_driver=log_to_driver, **ray_kwargs)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs: dict[str, Any] = {
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "include_dashboard": False,
        "_temp_dir": temp_dir or default_temp_dir(),
        "log_to_driver": log_to_driver,
    }
    if pinned:  # the host IP does not route to itself: keep Ray on loopback too
        kwargs["_node_ip_address"] = LOOPBACK_IP
    kwargs.update(ray_kwargs)
    return ray.init(**kwargs)


def shutdown_ray() -> None:
    """Disconnect (and stop a local cluster this process started)."""
    if ray.is_initialized():
        ray.shutdown()


__all__ = ["default_temp_dir", "init_ray", "shutdown_ray"]
