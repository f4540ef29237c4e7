"""Processes toolrl starts for tools (MCP servers over stdio): each in a process group of its
own, behind a watchdog (`toolrl.core.watchdog`), so none outlives its owner.

- `guarded_command` wraps a command line in the watchdog; start the result with
  ``start_new_session=True`` (the MCP SDK's stdio client does). The group then dies on close
  (the owner kills the group), when the server exits (the watchdog kills what it left), and
  when the owning thread or process dies, SIGKILL included (the kernel's parent-death signal
  wakes the watchdog, which SIGTERMs the group, waits ``grace`` s, then SIGKILLs it).
- `find_guarded` finds a watchdog again by the token of its command line; `kill_group` and
  `group_alive` act on its group.

The watchdog needs Linux (``prctl``); elsewhere `guarded_command` returns the command as is
and only the owner's own shutdown stops the group.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["WATCHDOG", "find_guarded", "group_alive", "guarded_command", "kill_group",
           "new_token"]

WATCHDOG = Path(__file__).with_name("watchdog.py")
WATCHDOG_MARK = "toolrl-watchdog"


def new_token() -> str:
    """A fresh token that names one guarded process group."""
    return f"{WATCHDOG_MARK}-{uuid.uuid4().hex}"


def guarded_command(command: Sequence[str], token: str, grace: float = 1.0) -> list[str]:
    """``command`` run behind the watchdog (Linux; elsewhere ``command`` unchanged).

    Args:
        command: the program and its arguments.
        token: names this group for `find_guarded` (`new_token`).
        grace: seconds between SIGTERM and SIGKILL when the owner dies.
    """
    if not command:
        raise ValueError("an empty command line")
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-I", "-S", str(WATCHDOG), str(os.getpid()), repr(float(grace)),
            token, "--", *command]


def _proc_stats() -> Iterator[tuple[int, list[bytes]]]:
    """``(pid, fields after the command name)`` of every process in ``/proc`` (state first,
    then ppid, pgrp, ...); raises OSError when ``/proc`` cannot be listed."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        yield int(name), stat[stat.rfind(b")") + 2:].split()


def find_guarded(token: str) -> list[int]:
    """Pids of this process's live watchdogs started with ``token`` (each leads its group)."""
    me, found = os.getpid(), []
    try:
        stats = list(_proc_stats())
    except OSError:
        return found
    for pid, fields in stats:
        try:
            if int(fields[1]) != me or fields[0] == b"Z":
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if token.encode() in argv:
            found.append(pid)
    return found


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member that is not a zombie."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stats = list(_proc_stats())
    except OSError:
        return True
    return any(len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z"
               for _, fields in stats)


def kill_group(pgid: int, grace: float = 0.0, poll: float = 0.01) -> bool:
    """SIGTERM process group ``pgid``, wait up to ``grace`` s, then SIGKILL it; waits (up to
    one more second) until no member is left. Returns whether the group is gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 1.0)):
        if sig == signal.SIGTERM and grace <= 0:
            continue
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return True
            time.sleep(poll)
    return not group_alive(pgid)
