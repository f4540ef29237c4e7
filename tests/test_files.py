"""Cached folders are built by one process at a time (`toolrl.files.build_lock`): two
processes that find the folder missing at the same moment (two runs started together, two test
workers) build it once, and neither sees it removed under it."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

from toolrl.files import atomic_folder, build_lock


def _build_once(target: str, start: float, results) -> None:
    """The callers' pattern: under the lock, use the folder if built, else build it slowly."""
    target_path = Path(target)
    while time.time() < start:  # both check at the same moment
        time.sleep(0.001)
    with build_lock(target_path):
        built_here = not (target_path / "done").exists()
        if built_here:
            with atomic_folder(target_path) as tmp:
                time.sleep(0.5)  # a slow build: the other process checks meanwhile
                (tmp / "done").write_text(str(os.getpid()))
        results.put((built_here, os.stat(target_path).st_ino,
                     (target_path / "done").read_text()))


def test_two_processes_build_a_missing_folder_once(tmp_path):
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    start = time.time() + 0.5
    procs = [ctx.Process(target=_build_once, args=(str(tmp_path / "model"), start, results))
             for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0]
    got = [results.get(timeout=5) for _ in procs]
    assert sorted(built for built, _, _ in got) == [False, True]  # one built, one reused
    assert len({inode for _, inode, _ in got}) == 1  # nobody replaced the other's folder
    assert len({pid for _, _, pid in got}) == 1
    assert (tmp_path / ".model.lock").exists()  # beside the folder, not inside it
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["done"]
