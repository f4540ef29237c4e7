"""The run directory's lock: one training run writes into a run directory at a time.

`RunDirLock.acquire` takes an exclusive ``flock`` on ``<run dir>/.lock`` without waiting; a
second run into the same directory fails at once with `RunDirInUse`, naming the holder (pid,
host, start time). The kernel drops the lock when its process exits, however it exits, so a
killed run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

__all__ = ["LOCK_FILE", "RunDirInUse", "RunDirLock"]

LOCK_FILE = ".lock"


class RunDirInUse(RuntimeError):
    """Another live run holds the run directory."""


class RunDirLock:
    """An exclusive, non-blocking lock on one run directory (created if missing)."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self._file = None

    @property
    def path(self) -> Path:
        return self.run_dir / LOCK_FILE

    def acquire(self) -> RunDirLock:
        """Take the lock or raise `RunDirInUse` (one line: who holds it, what to change)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 - held open for the run's lifetime
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = _holder(f.read())
            f.close()
            raise RunDirInUse(f"run dir {self.run_dir} is in use by another run ({holder}); "
                              f"stop that run first, or set trainer.output_dir to another "
                              f"directory") from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                            "started": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        """Drop the lock (the file stays: removing it could let two runs lock two files)."""
        f, self._file = self._file, None
        if f is not None:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            f.close()

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
