"""vLLM's engine processes die with the thread that started them (Linux).

vLLM's ``AsyncLLM`` runs its ``EngineCore`` in a process of its own, and with
``EngineConfig.multiprocessing`` the model worker in one more below it. vLLM gives the engine
core no parent-death signal: an owner that dies without shutting the engine down (SIGKILL, the
OOM killer, a Ray worker that exits hard) leaves it running, ~2 GB each, until someone kills
it by hand. (The model worker has vLLM's own "death pipe", but notices it only once loaded.)

`install` wraps the entry points of both processes (``EngineCoreProc.run_engine_core`` and
``WorkerProc.worker_main``) so that each first asks the kernel for SIGKILL when the thread
that started it dies (``prctl(PR_SET_PDEATHSIG)``), and exits at once if that parent is gone
already. The wrappers are module-level functions: ``spawn`` pickles a process target by its
name, so the child imports this module and runs the wrapper (which installs itself there too,
for the worker the engine core starts); ``fork`` inherits the patched class.

"The thread that started it": `toolrl.rollout.engine.VLLMEngine` builds the engine on its own
event-loop thread, which lives until the engine's shutdown.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["die_with_parent", "install", "run_engine_core", "worker_main"]

PR_SET_PDEATHSIG = 1
_ORIGINALS: dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel for ``sig`` when the thread that started this process dies; exit now if
    the parent (multiprocessing's, when this process is one of its children) is gone already.
    A no-op outside Linux."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died before the prctl
        os._exit(1)


def install() -> None:
    """Make vLLM's engine-core and model-worker processes started from now on (in this
    process) die with their parent. Idempotent; a no-op outside Linux."""
    if not sys.platform.startswith("linux"):
        return
    with _LOCK:
        if _ORIGINALS:
            return
        from vllm.v1.engine.core import EngineCoreProc
        from vllm.v1.executor.multiproc_executor import WorkerProc

        _ORIGINALS["engine_core"] = EngineCoreProc.run_engine_core
        _ORIGINALS["worker"] = WorkerProc.worker_main
        EngineCoreProc.run_engine_core = staticmethod(run_engine_core)
        WorkerProc.worker_main = staticmethod(worker_main)


def run_engine_core(*args: Any, **kwargs: Any) -> Any:
    """vLLM's engine-core process, dying with its parent."""
    die_with_parent()
    install()  # here too: the model worker this process may start
    return _ORIGINALS["engine_core"](*args, **kwargs)


def worker_main(*args: Any, **kwargs: Any) -> Any:
    """vLLM's model-worker process, dying with the engine core."""
    die_with_parent()
    install()
    return _ORIGINALS["worker"](*args, **kwargs)
