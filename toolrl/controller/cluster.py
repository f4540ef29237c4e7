"""Start or join the Ray cluster the controller runs on.

`init_ray` is the embedded default: without an address it starts a local cluster sized by its
arguments (token auth off, usage stats off, a short session dir under the system temp dir);
with ``address=`` or ``RAY_ADDRESS`` set it connects to that existing cluster. The loopback
guard of `toolrl.controller.network` runs first, so Ray and every worker inherit its variables.
Worker processes use the driver's interpreter, so an installed (or editable) toolrl imports
there as it does in the driver; no ``runtime_env`` working_dir is shipped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from multiprocessing import forkserver, resource_tracker
from pathlib import Path
from typing import Any

import ray

# isort: split
# psutil after ray: Ray ships its own copy (ray/thirdparty_files, on sys.path once ray is
# imported); toolrl does not depend on psutil itself.
import psutil

from toolrl.controller.network import LOOPBACK_IP, apply_loopback_guard


def default_temp_dir() -> str:
    """A short per-process session dir (Ray's socket paths have a length limit)."""
    return str(Path(tempfile.gettempdir()) / f"ray-toolrl-{os.getpid()}")


def init_ray(num_cpus: int | None = None, num_gpus: int | None = None, *,
             address: str | None = None, temp_dir: str | None = None,
             log_to_driver: bool = False, **ray_kwargs: Any) -> Any:
    """Connect to ``address`` / ``RAY_ADDRESS``, or start a local cluster; no-op if connected.

    Args:
        num_cpus: CPUs of a local cluster (ignored when connecting).
        num_gpus: GPUs of a local cluster (ignored when connecting).
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
        with _python_sigterm_kept():
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
    global _started_local
    with _python_sigterm_kept():
        context = ray.init(**kwargs)
    _started_local = True
    return context


@contextlib.contextmanager
def _python_sigterm_kept() -> Iterator[None]:
    """Ray's core worker installs a C-level SIGTERM handler that aborts the driver (exit 134,
    no clean-up): a Python handler the process had (``toolrl train``'s) is put back."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if callable(before) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, before)


_started_local = False  # init_ray started the local cluster this process is connected to


def shutdown_ray(timeout: float = 20.0, started_only: bool = False) -> None:
    """Disconnect; a local cluster `init_ray` started is stopped whole: every process under
    this one (Ray's GCS, raylet, agents and workers; engines) is gone when this returns,
    the ones still there after ``timeout`` s are SIGKILLed. ``started_only``: leave a
    cluster `init_ray` did not start (joined, or a caller's) as it is."""
    global _started_local
    if not ray.is_initialized() or (started_only and not _started_local):
        return
    helpers = _multiprocessing_helpers()
    ours = [p for p in psutil.Process().children(recursive=True) if p.pid not in helpers] \
        if _started_local else []
    ray.shutdown()
    _started_local = False
    _, alive = psutil.wait_procs(ours, timeout=timeout)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)


def _multiprocessing_helpers() -> set[int]:
    """multiprocessing's fork server and resource tracker of this process: they are this
    process's, not the cluster's, and outlive it (the next cluster's engine cores fork from
    the same server); what the server forked for the cluster's workers is still stopped."""
    return {pid for pid in (forkserver._forkserver._forkserver_pid,  # type: ignore[attr-defined]
                            resource_tracker._resource_tracker._pid)  # type: ignore[attr-defined]
            if pid}


def kill_process_tree(pid: int, timeout: float = 5.0) -> None:
    """SIGKILL ``pid`` and every process under it (the watchdog's hard stop); on this node."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=timeout)


def kill_local_cluster() -> None:
    """SIGKILL the local cluster `init_ray` started (every process under this one); a hard
    stop for when `shutdown_ray` cannot run (the process is about to ``os._exit``)."""
    if _started_local:
        for child in psutil.Process().children():
            kill_process_tree(child.pid, timeout=2.0)


__all__ = ["default_temp_dir", "init_ray", "kill_local_cluster", "kill_process_tree",
           "shutdown_ray"]
