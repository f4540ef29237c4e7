"""Process groups and tags: how the scheduler finds, and kills, everything a test file started.

Each test file runs as the leader of its own session (``start_new_session=True``), so one
``killpg`` reaches pytest and every child it forked: Ray's GCS, raylet and workers,
torch.distributed ranks. A child that starts its own session escapes the group, so each file
also carries a tag in an environment variable that every descendant inherits; a scan of
``/proc`` finds those. Zombies count as gone: they hold no memory and no device.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

TAG_VARIABLE = "TOOLRL_TEST_SCHEDULER_TAGS"
_PROC = Path("/proc")
_TAG_PREFIX = TAG_VARIABLE.encode() + b"="


def add_tag(environ: MutableMapping[str, str], tag: str) -> None:
    """Append ``tag`` to the environment's tag list (a nested scheduler keeps its parent's)."""
    old = environ.get(TAG_VARIABLE, "")
    environ[TAG_VARIABLE] = f"{old}:{tag}" if old else tag


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    pgid: int
    tags: frozenset[str]


def _read_info(pid: int) -> ProcessInfo | None:
    """None for a process that is gone or a zombie."""
    base = _PROC / str(pid)
    try:
        stat = (base / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces and ')'
    if fields[0] in ("Z", "X"):
        return None
    tags: frozenset[str] = frozenset()
    try:
        for entry in (base / "environ").read_bytes().split(b"\0"):
            if entry.startswith(_TAG_PREFIX):
                tags = frozenset(entry[len(_TAG_PREFIX):].decode(errors="replace").split(":"))
                break
    except OSError:  # another user's process: its group still counts
        pass
    return ProcessInfo(pid, int(fields[2]), tags)


def snapshot() -> list[ProcessInfo]:
    """Every live, non-zombie process (empty where there is no /proc)."""
    try:
        pids = [int(p.name) for p in _PROC.iterdir() if p.name.isdigit()]
    except OSError:
        return []
    me = os.getpid()
    return [info for pid in pids if pid != me and (info := _read_info(pid)) is not None]


def is_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    if _PROC.is_dir():
        return _read_info(pid) is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def job_processes(pgid: int | None, tag: str,
                  processes: list[ProcessInfo] | None = None) -> set[int]:
    """Live processes of one test file: its process group ``pgid`` and every carrier of ``tag``."""
    if not _PROC.is_dir():  # no /proc: ask the kernel whether the group still exists
        if pgid is None:
            return set()
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return set()
        return {pgid}
    procs = snapshot() if processes is None else processes
    return {p.pid for p in procs if p.pgid == pgid or tag in p.tags}


def signal_job(pgid: int | None, tag: str, sig: int = signal.SIGKILL,
               processes: list[ProcessInfo] | None = None) -> set[int]:
    """Send ``sig`` to the file's process group and every process carrying ``tag``."""
    targets = job_processes(pgid, tag, processes)
    if not targets:
        return targets
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return targets
