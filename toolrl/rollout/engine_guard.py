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

`fork_server` makes the engine core start sooner, and cheaper, on CPU, where vLLM spawns it
(its CPU platform forces ``spawn``): a spawned core re-imports vLLM and torch (~10 CPU-s on 2
cores) while its owner waits. The process starts multiprocessing's fork server once, with
vLLM's engine core preloaded, so that import runs beside the owner's own, and forks the core
of every engine it builds from it: an engine built after the first starts without importing
anything (a tiny model's engine: 15-17 s -> ~4 s of CPU here). The forked core takes the
environment of the process that started it (a fork server's child would have the server's),
torch's thread count from it, and dies with the server. The server lives as long as its
owner, as multiprocessing's own does: it exits when the owner does (on EOF of its "alive"
pipe), and the memory plan counts it (`toolrl.trainer.memory`).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.context
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from multiprocessing import forkserver
from typing import Any

__all__ = ["die_with_parent", "fork_server", "fork_server_pid", "install", "run_engine_core",
           "start_fork_server", "worker_main"]

PR_SET_PDEATHSIG = 1
_ORIGINALS: dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()
_SERVER_LOCK = threading.Lock()
_PARENT: dict[str, int] = {}  # a forked core's parent: the fork server, not its owner


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
    expected = _PARENT.get("pid", parent.pid if parent is not None else None)
    if expected is not None and os.getppid() != expected:  # it died before the prctl
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


# --- the engine core forked from a fork server --------------------------------------------------
PRELOAD = ("vllm.v1.engine.core", "vllm.v1.executor.uniproc_executor",
           "vllm.v1.worker.cpu_worker")


def start_fork_server() -> int:
    """Start (or find) this process's fork server, importing vLLM's engine core and this
    module in the background. Returns its pid."""
    forkserver.set_forkserver_preload([__name__, *PRELOAD])
    forkserver.ensure_running()
    return forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]


def fork_server_pid() -> int | None:
    """The pid of this process's fork server (None before its first CPU engine); it outlives
    the engines forked from it."""
    return forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]


def _forget_fork_server() -> None:
    """In a child forked from a process that runs a fork server: that server is the parent's
    (not this process's child; it must see EOF when the parent exits), so the child lets go of
    it and starts its own for its first engine."""
    server: Any = forkserver._forkserver
    if server._forkserver_pid is None:
        return
    if server._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
    server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
    server._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_fork_server)


class _ForkedCore(multiprocessing.context.ForkServerProcess):
    """A process forked by the fork server with its starter's environment."""

    def start(self) -> None:
        self._starter_env = dict(os.environ)  # pickled with the process, at the start
        self._server_pid = start_fork_server()
        super().start()

    def run(self) -> None:
        # Hold no write end of the server's "alive" pipe: the server must see EOF, and exit,
        # once the owner is gone; this process dies with it (`die_with_parent`).
        fd = forkserver._forkserver._forkserver_alive_fd  # type: ignore[attr-defined]
        if fd is not None:
            os.close(fd)
            forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]
        _PARENT["pid"] = self._server_pid
        os.environ.clear()
        os.environ.update(self._starter_env)
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads:  # torch was imported in the server: as a spawned core's torch reads it
            import torch

            torch.set_num_threads(int(threads))
        super().run()


class _ForkServerContext(multiprocessing.context.ForkServerContext):
    Process = _ForkedCore  # type: ignore[assignment]


@contextlib.contextmanager
def fork_server() -> Iterator[None]:
    """While vLLM builds an engine here, its engine core is forked from the fork server."""
    import vllm.v1.engine.utils as engine_utils

    with _SERVER_LOCK:
        original = engine_utils.get_mp_context
        engine_utils.get_mp_context = _ForkServerContext
        try:
            yield
        finally:
            engine_utils.get_mp_context = original
