"""The run directory's lock and identity: one run writes into a run directory at a time, and
a run never resumes from (or reuses the warm start of) another model's or env's run.

`RunDirLock.acquire` takes an exclusive ``flock`` on ``<run dir>/.lock`` without waiting; a
second run into the same directory fails at once with `RunDirInUse`, naming the holder (pid,
host, start time). The kernel drops the lock when its process exits, however it exits, so a
killed run never leaves a stale lock behind.

`check_same_run` compares the keys that make a run's state (`IDENTITY_KEYS`) with the
``config.yaml`` an earlier run left in the directory, before anything of that run is reused:
a run dir holding checkpoints or a warm start of ``model.path=models/tiny`` is not resumed by
a config that now says ``model.path=org/other`` (one line naming both and what to change).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from toolrl.trainer.config import ConfigError

__all__ = ["IDENTITY_KEYS", "LOCK_FILE", "RunDirInUse", "RunDirLock", "RunDirMismatch",
           "check_same_run"]

LOCK_FILE = ".lock"
# what a run's checkpoints and warm start were made of: another value is another run
IDENTITY_KEYS = ("model.path", "model.tiny_size", "env.id")


class RunDirInUse(RuntimeError):
    """Another live run holds the run directory."""


class RunDirMismatch(ConfigError):
    """The run directory holds the state of a run with another model or env."""


def check_same_run(run_dir: str | os.PathLike, config: dict[str, Any], resume: str) -> None:
    """Raise `RunDirMismatch` when ``run_dir`` holds checkpoints (``resume: auto``) or a warm
    start of a run whose `IDENTITY_KEYS` differ from ``config``'s (plain data, as saved)."""
    run_dir = Path(run_dir)
    saved = run_dir / "config.yaml"
    reused = [name for name, used in (("checkpoints", resume == "auto"), ("warm_start", True))
              if used and any((run_dir / name).glob("*"))]
    if not reused or not saved.exists():
        return
    before = OmegaConf.to_container(OmegaConf.load(saved))
    for key in IDENTITY_KEYS:
        old, new = _get(before, key), _get(config, key)
        if old != new:
            raise RunDirMismatch(
                f"run dir {run_dir} holds the {' and '.join(reused)} of a run with {key}="
                f"{old!r}, and this config says {key}={new!r}: set trainer.output_dir to "
                f"another directory (or delete {run_dir})")


def _get(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


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
