"""Device-aware test scheduling: pack test files onto free GPUs by their declared need.

A test file declares how many devices it needs (``DEVICES = 2`` or ``@pytest.mark.devices(2)``);
``python -m tools.gpu_scheduler`` (from the repository root) runs every file as its own pytest
process on that many free devices, largest first, refilling freed devices at once.
"""

from tools.gpu_scheduler.collect import CollectError, TestFile, collect, declared_devices
from tools.gpu_scheduler.inventory import InventoryError, detect_devices, parse_devices
from tools.gpu_scheduler.scheduler import (
    FileResult,
    FileStatus,
    Scheduler,
    SchedulerOptions,
    exit_code,
    main,
    run_files,
)

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
