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

A Ray worker is a new process, so each would start (and import into) a server of its own.
Instead the driver starts one (`shared_fork_server`, from `RolloutWorker.early_start`) and the
workers on its machine fork their cores from it (`join_fork_server`): one vLLM import per
machine and driver, not one per worker and restart (a driver that trains many runs, as the
test suite does, pays it once). Such a core is not its owner's grandchild, so it watches its
owner (multiprocessing's parent sentinel: the owner's end of the pipe it was sent through)
and dies with it; it dies with the server, and so with the driver, as before. A worker on
another machine, or one that cannot reach the server's socket, starts its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from multiprocessing import forkserver, popen_forkserver, reduction, resource_tracker, spawn, util
from typing import Any

__all__ = ["die_with_parent", "fork_server", "fork_server_pid", "install", "join_fork_server",
           "run_engine_core", "shared_fork_server", "start_fork_server", "started_pids",
           "worker_main"]

PR_SET_PDEATHSIG = 1
_ORIGINALS: dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()
_SERVER_LOCK = threading.Lock()
_PARENT: dict[str, int] = {}  # a forked core's parent: the fork server, not its owner
_SHARED: dict[str, Any] = {}  # another process's fork server this one forks its cores from
_STARTED: list[int] = []  # the processes a fork server forked for this one (`started_pids`)


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
        # lazy: vLLM is optional and takes seconds to import
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
    """Start (or find) the fork server this process forks its engine cores from: the one it
    joined (`join_fork_server`), or its own, importing vLLM's engine core and this module in
    the background. Returns its pid."""
    if _SHARED:
        return _SHARED["pid"]
    forkserver.set_forkserver_preload([__name__, *PRELOAD])
    _forget_ended_server()
    forkserver.ensure_running()
    return forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]


def _forget_ended_server() -> None:
    """Let multiprocessing start a new fork server where this process's has ended and someone
    else reaped it (a ``psutil.wait_procs`` over this process's children, a user's
    ``waitpid(-1)``): its ``ensure_running`` would wait on a pid that is no longer a child
    and raise ChildProcessError, so every later engine of this process would fail to start."""
    server = forkserver._forkserver  # type: ignore[attr-defined]
    with server._lock:
        pid = server._forkserver_pid
        if pid is None:
            return
        try:
            ended, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            ended = pid
        if ended:
            os.close(server._forkserver_alive_fd)
            server._forkserver_address = None
            server._forkserver_alive_fd = None
            server._forkserver_pid = None


def fork_server_pid() -> int | None:
    """The pid of the fork server this process forks its engine cores from (None before its
    first CPU engine); it outlives the engines forked from it."""
    if _SHARED:
        return _SHARED["pid"]
    return forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]


def started_pids() -> list[int]:
    """The processes this one had a fork server fork, oldest first: a joined server's are not
    among this process's children."""
    return list(_STARTED)


def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def shared_fork_server() -> dict[str, Any] | None:
    """Start (or find) this process's own fork server and say how another process on this
    machine forks from it (`join_fork_server`). None where it cannot be shared: outside
    Linux, or a Python whose fork server authenticates its clients (3.14+)."""
    if not sys.platform.startswith("linux") or hasattr(forkserver._forkserver,
                                                       "_forkserver_authkey"):
        return None
    if _SHARED:  # a worker that joined a server passes that one on
        return {k: _SHARED[k] for k in ("address", "pid", "boot_id")}
    pid = start_fork_server()
    return {"address": forkserver._forkserver._forkserver_address,  # type: ignore[attr-defined]
            "pid": pid, "boot_id": _boot_id()}


def join_fork_server(server: dict[str, Any] | None) -> int:
    """Fork this process's engine cores from ``server`` (`shared_fork_server` of another
    process, e.g. the driver) when it runs on this machine and its socket is reachable from
    here; otherwise start this process's own. Returns the pid of the server in use."""
    if server and server.get("pid") != os.getpid() and not _SHARED \
            and forkserver._forkserver._forkserver_pid is None:  # type: ignore[attr-defined]
        try:
            here = (server["boot_id"] == _boot_id() and os.path.exists(server["address"])
                    and _alive(server["pid"]))
        except OSError:
            here = False
        if here:
            _SHARED.update(server)
    return start_fork_server()


def _alive(pid: int) -> bool:
    """``pid`` runs and is this user's (another user's server is not one to join)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _connect_shared(fds: list[int]) -> tuple[int, int]:
    """`forkserver.connect_to_new_process`, to the joined server: its socket, this process's
    resource tracker, and a placeholder for the "alive" pipe (the server is not ours to keep
    alive; the forked process closes it)."""
    if "placeholder" not in _SHARED:
        _SHARED["placeholder"] = os.open(os.devnull, os.O_RDONLY)
    resource_tracker.ensure_running()
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(_SHARED["address"])
        parent_r, child_w = os.pipe()
        child_r, parent_w = os.pipe()
        try:
            reduction.sendfds(client, [child_r, child_w, _SHARED["placeholder"],
                                       resource_tracker.getfd(), *fds])
            return parent_r, parent_w
        except BaseException:
            os.close(parent_r)
            os.close(parent_w)
            raise
        finally:
            os.close(child_r)
            os.close(child_w)


class _SharedPopen(popen_forkserver.Popen):
    """The stdlib's fork-server Popen, connecting to the joined server (its ``_launch`` with
    `_connect_shared` in place of the module's own server)."""

    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        multiprocessing.context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            multiprocessing.context.set_spawning_popen(None)
        self.sentinel, w = _connect_shared(self._fds)
        # our end of the data pipe stays open: the child's parent sentinel (`_watch_owner`)
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


def _watch_owner() -> None:
    """In a process forked by another process's server: SIGKILL it when its owner (the
    process that started it) is gone, as the kernel does for a server's own child."""
    sentinel = multiprocessing.parent_process().sentinel  # type: ignore[union-attr]

    def watch() -> None:
        multiprocessing.connection.wait([sentinel])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="toolrl-owner-watch", daemon=True).start()


def _forget_fork_server() -> None:
    """In a child forked from a process that runs a fork server: that server is the parent's
    (not this process's child; it must see EOF when the parent exits), so the child lets go of
    it and starts its own for its first engine."""
    _SHARED.clear()  # its socket is reachable, but the child decides for itself
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
        self._joined = bool(_SHARED)
        try:
            super().start()
        except OSError:  # the joined server's socket is gone: this process's own, then
            if not self._joined:
                raise
            _SHARED.clear()
            self._server_pid, self._joined = start_fork_server(), False
            super().start()
        _STARTED.append(self.pid)

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        if process_obj._joined:
            return _SharedPopen(process_obj)
        return popen_forkserver.Popen(process_obj)

    def run(self) -> None:
        if self._joined:
            _watch_owner()
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
            # lazy: vLLM's spawned processes import this module first (their entry points'
            # wrappers), so it stays light and the death signal is set at once
            import torch

            torch.set_num_threads(int(threads))
        super().run()


class _ForkServerContext(multiprocessing.context.ForkServerContext):
    Process = _ForkedCore  # type: ignore[assignment]


@contextlib.contextmanager
def fork_server() -> Iterator[None]:
    """While vLLM builds an engine here, its engine core is forked from the fork server."""
    # lazy: vLLM is optional and takes seconds to import
    import vllm.v1.engine.utils as engine_utils

    with _SERVER_LOCK:
        original = engine_utils.get_mp_context
        engine_utils.get_mp_context = _ForkServerContext
        try:
            yield
        finally:
            engine_utils.get_mp_context = original
