"""One line for an exception: what was raised, and where (the innermost frame of its
traceback), so a failure inside a worker reads on the driver's console like a traceback's
last lines."""

from __future__ import annotations

import traceback
from pathlib import Path

__all__ = ["describe_exception"]


def describe_exception(exc: BaseException, stage: str | None = None) -> str:
    """``"[stage: ]Type: first line of the message (at file.py:LINE in function)"``."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    if frames:
        last = frames[-1]
        line += f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"
    return f"{stage}: {line}" if stage else line
