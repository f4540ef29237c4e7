"""Crash-safe checkpoint directories: write into a temp dir, mark complete, rename.

Layout of one checkpoint (``checkpoints/step_<N>/``):

    actor/            torch.distributed.checkpoint shards (model, optimizer, scheduler)
    critic/           the same for the critic (PPO)
    trainer_state.pt  step, data-loader position, RNG states of the driver
    COMPLETE          written last; a directory without it is never resumed from

A save killed midway leaves only ``.tmp-step_<N>``; `latest_checkpoint` ignores it, so a
resume picks the previous complete checkpoint.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

COMPLETE = "COMPLETE"
_STEP_DIR = re.compile(r"^step_(\d+)$")

def checkpoint_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"step_{step}"

def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / COMPLETE).exists():
            found.append((int(m.group(1)), child))
    return sorted(found)

def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None

@contextmanager
def atomic_checkpoint(root: str | os.PathLike, step: int, keep: int | None = None
                      ) -> Iterator[Path]:
    """Yield a temp dir to write step ``step`` into; on success mark it complete and rename.

    On an exception the temp dir is removed and nothing else changes. ``keep`` prunes all but
    the newest ``keep`` complete checkpoints afterwards.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir(root, step)
    tmp = root / f".tmp-step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        # Fault-injection point for tests: widen the window in which a save can be killed.
        delay = float(os.environ.get("TOOLRL_FAULT_CHECKPOINT_DELAY_S", "0") or 0)
        if delay > 0:
            time.sleep(delay)
        (tmp / COMPLETE).write_text(str(step))
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep is not None and keep > 0:
        for _, old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

def rng_state() -> dict[str, Any]:
    """The driver's RNG states (python, numpy, torch)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}

def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])

def save_trainer_state(path: str | os.PathLike, state: dict[str, Any]) -> None:
    torch.save({**state, "rng": rng_state()}, Path(path) / "trainer_state.pt")

def load_trainer_state(path: str | os.PathLike, restore_rng: bool = True) -> dict[str, Any]:
    state = torch.load(Path(path) / "trainer_state.pt", weights_only=False)
    if restore_rng:
        set_rng_state(state["rng"])
    return state

def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
