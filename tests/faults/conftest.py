"""Fixtures of the fault suite."""

from __future__ import annotations

import pytest
from fault_harness import RELEASE_HUNG_TOOLS


@pytest.fixture(scope="module", autouse=True)
def release_hung_tool_threads():
    """Threads of deliberately hung sync tools wait on this event; each module ends them."""
    RELEASE_HUNG_TOOLS.clear()
    yield
    RELEASE_HUNG_TOOLS.set()
