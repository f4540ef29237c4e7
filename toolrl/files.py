"""Folders written whole or not at all (built models, tokenizers, unpacked wheels), and built
by one process at a time."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_folder(target: str | os.PathLike) -> Iterator[Path]:
    """A fresh temporary folder beside ``target`` that replaces ``target`` when the block ends
    without an error; a failed or killed build never leaves a half-written ``target``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def build_lock(target: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on building ``target`` (a lock file beside it): two processes
    that find the same cached folder missing (two runs started together, test workers) build
    it once, one after the other; the second finds it built. Without it the second build's
    replace can remove the folder while the first process reads it."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
