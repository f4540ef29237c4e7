"""pytest plugin for files run by the device scheduler: ``pytest -p tools.gpu_scheduler.plugin``.

The scheduler loads it in every file's pytest run. It registers the ``devices`` marker (so
``--strict-markers`` accepts ``@pytest.mark.devices(2)``), names the devices the file was given
in the report header, and offers them as the ``scheduled_devices`` fixture.
"""

from __future__ import annotations

import os

import pytest

from tools.gpu_scheduler.collect import MARKER


def visible_devices() -> list[str]:
    """The ids in ``CUDA_VISIBLE_DEVICES`` (empty when unset or empty)."""
    return [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(n): the test file needs n devices; the GPU test scheduler "
                   f"runs it with CUDA_VISIBLE_DEVICES set to n free ones")


def pytest_report_header(config: pytest.Config) -> str:
    shown = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    return f"GPU test scheduler: CUDA_VISIBLE_DEVICES={shown}"


@pytest.fixture
def scheduled_devices() -> list[str]:
    """The device ids this test file was given."""
    return visible_devices()
