"""Device-aware test scheduling: pack test files onto free GPUs by their declared need.

A test file declares how many devices it needs (``DEVICES = 2`` or ``@pytest.mark.devices(2)``);
``toolrl test-scheduler`` (or ``python -m toolrl.testing.scheduler``) runs every file as its
own pytest process on that many free devices, largest first, refilling freed devices at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from toolrl.testing.collect import CollectError, TestFile, collect, declared_devices
from toolrl.testing.inventory import InventoryError, detect_devices, parse_devices

if TYPE_CHECKING:
    from toolrl.testing.scheduler import (
        FileResult,
        FileStatus,
        Scheduler,
        SchedulerOptions,
        exit_code,
        main,
        run_files,
    )

# Loaded on first use, so `python -m toolrl.testing.scheduler` runs a fresh module.
_LAZY = ("FileResult", "FileStatus", "Scheduler", "SchedulerOptions", "exit_code", "main",
         "run_files")

__all__ = [
    "CollectError",
    "FileResult",
    "FileStatus",
    "InventoryError",
    "Scheduler",
    "SchedulerOptions",
    "TestFile",
    "collect",
    "declared_devices",
    "detect_devices",
    "exit_code",
    "main",
    "parse_devices",
    "run_files",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module("toolrl.testing.scheduler"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
