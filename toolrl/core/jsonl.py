"""JSON-lines files of objects, read with errors that name the file and line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any


def json_objects(path: str | os.PathLike, what: str = "a JSON object"
                 ) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-empty line of a JSON-lines file; a line that is
    not JSON, or not an object, raises ValueError naming the file and line."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: each line must be {what}")
            yield lineno, obj
