"""Folders written whole or not at all (built models, tokenizers, unpacked wheels)."""

from __future__ import annotations

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
