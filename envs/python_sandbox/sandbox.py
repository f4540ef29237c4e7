"""Run untrusted Python in a subprocess: kernel namespaces, rlimits, wall clock, output cap.

`run_python` writes the code to a fresh temporary directory, starts `launcher.py` (which
isolates the process and execs the interpreter; see its docstring), reads stdout/stderr up to
``max_output_bytes`` each (more output kills the run), kills the whole process group after
``wall_s`` seconds, and removes the directory. `isolation_error` probes once per process
whether the kernel allows the isolation; the env refuses to start when it does not (fail
closed: the code never runs without it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

LAUNCHER = Path(__file__).with_name("launcher.py")
SANDBOX_ERROR_EXIT = 97
# As root, each run gets its own unused uid from this range, so RLIMIT_NPROC (counted per uid)
# limits that run alone and concurrent runs cannot see or signal each other.
UID_BASE, UID_RANGE = 200_000, 60_000


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run."""

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    open_files: int = 64
    processes: int = 32
    max_output_bytes: int = 64 << 10


@dataclass
class RunResult:
    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool = False
    output_exceeded: bool = False
    sandbox_error: str | None = None


class SandboxUnavailable(RuntimeError):
    """The kernel does not allow the isolation the sandbox needs."""


def _environment(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir,
            "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _config(workdir: str, limits: Limits, uid: int | None, probe: bool = False) -> str:
    return json.dumps({
        "workdir": workdir, "script": "main.py", "python": sys.executable, "probe": probe,
        "uid": uid, "parent": os.getpid(),
        "expose": [sys.base_prefix, sys.prefix], "env": _environment(workdir),
        "limits": {"cpu_s": limits.cpu_s, "memory_bytes": limits.memory_bytes,
                   "file_bytes": limits.file_bytes, "open_files": limits.open_files,
                   "processes": limits.processes}})


def _workdir() -> tuple[str, int | None]:
    """A fresh work directory, owned by the uid the code will run as (root: a fresh uid)."""
    workdir = tempfile.mkdtemp(prefix="toolrl-sandbox-")
    uid = None
    if os.geteuid() == 0:
        uid = UID_BASE + secrets.randbelow(UID_RANGE)
        os.chown(workdir, uid, uid)
    return workdir, uid


def _launcher_cmd(config: str) -> list[str]:
    return [sys.executable, "-I", "-S", str(LAUNCHER), config]


@functools.cache
def isolation_error() -> str | None:
    """None when the sandbox can isolate code on this machine, else why not."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux namespaces; this is {sys.platform}"
    workdir, uid = _workdir()
    try:
        done = subprocess.run(_launcher_cmd(_config(workdir, Limits(), uid, probe=True)),
                              cwd=workdir,
                              capture_output=True, text=True, timeout=30,
                              env=_environment(workdir))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot start the sandbox launcher: {exc}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if done.returncode != 0:
        return (done.stderr.strip().removeprefix("SANDBOX_ERROR: ")
                or f"launcher exit code {done.returncode}")
    return None


async def _drain(stream: asyncio.StreamReader, cap: int, over: asyncio.Event) -> bytes:
    """``stream`` read to its end, its first ``cap`` bytes kept; past them ``over`` is set (the
    run is killed) and the rest is read and dropped: a pipe left unread stops its transport
    reading, so asyncio never sees the process end and ``wait()`` hangs to its timeout."""
    data = bytearray()
    while chunk := await stream.read(65536):
        if len(data) + len(chunk) > cap:
            over.set()
        data += chunk[:max(0, cap - len(data))]
    return bytes(data)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_python(code: str, limits: Limits = Limits()) -> RunResult:
    """Run ``code`` isolated; never raises for what the code does."""
    workdir, uid = _workdir()
    try:
        script = Path(workdir) / "main.py"
        script.write_text(code)
        if uid is not None:
            os.chown(script, uid, uid)
        proc = await asyncio.create_subprocess_exec(
            *_launcher_cmd(_config(workdir, limits, uid)), cwd=workdir, env=_environment(workdir),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        over = asyncio.Event()
        readers = asyncio.gather(_drain(proc.stdout, limits.max_output_bytes, over),
                                 _drain(proc.stderr, limits.max_output_bytes, over))
        overflow = asyncio.ensure_future(over.wait())
        timed_out = False
        try:
            done, _ = await asyncio.wait({readers, overflow}, timeout=limits.wall_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                timed_out = True
            if timed_out or over.is_set():
                _kill_group(proc.pid)
            stdout, stderr = await asyncio.wait_for(readers, timeout=30)
            # A killed sandbox can take a while to go (namespace teardown on a busy machine):
            # wait, but never raise out of here for it.
            try:
                exit_code: int | None = await asyncio.wait_for(proc.wait(), timeout=30)
            except TimeoutError:
                exit_code = None
        finally:
            overflow.cancel()
            if proc.returncode is None:
                _kill_group(proc.pid)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), timeout=30)
        err_text = stderr.decode("utf-8", errors="replace")
        sandbox_error = None
        if exit_code == SANDBOX_ERROR_EXIT and "SANDBOX_ERROR:" in err_text:
            sandbox_error = err_text.split("SANDBOX_ERROR:", 1)[1].strip()
        return RunResult(stdout=stdout.decode("utf-8", errors="replace"), stderr=err_text,
                         exit_code=None if timed_out else exit_code, timed_out=timed_out,
                         output_exceeded=over.is_set(), sandbox_error=sandbox_error)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
