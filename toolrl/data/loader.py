"""Task rows: load them from files, and deal them out in shuffled batches that resume exactly.

A task row is a plain dict (``id``, ``messages`` and/or env-specific fields, ``ground_truth``,
optional ``category``). Rows come from a file (JSON list, JSONL or parquet) or from an env's own
task generator; `TaskLoader` shuffles them per epoch with a seed and remembers its position so a
resumed run draws exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from toolrl.core.jsonl import json_objects

Row = dict[str, Any]


def load_rows(path: str | os.PathLike, *, default_ids: bool = True) -> list[Row]:
    """Read task rows from ``.json``, ``.jsonl`` or ``.parquet``.

    A ``.json`` file holds a list of rows, ``{"rows": [...]}``, or one row per line (BFCL ships
    its data as JSON lines named ``.json``). With ``default_ids`` a row without ``id`` gets
    ``<file stem>-<index>``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = _json_lines(path, path.read_text(encoding="utf-8"))
    elif suffix == ".json":
        text = path.read_text(encoding="utf-8")
        try:
            rows = json.loads(text)
        except json.JSONDecodeError:
            rows = _json_lines(path, text)
        if isinstance(rows, dict):  # {"rows": [...]}, or a JSON-lines file of one row
            rows = rows["rows"] if isinstance(rows.get("rows"), list) else [rows]
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of task rows (or one per line)")
    elif suffix == ".parquet":
        import pyarrow.parquet as pq  # lazy: pyarrow is heavy, for parquet files only

        rows = pq.read_table(path).to_pylist()
    else:
        raise ValueError(f"{path}: unsupported task file type {suffix!r} "
                         "(use .json, .jsonl or .parquet)")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {i} is {type(row).__name__}, expected an object")
        if default_ids:
            row.setdefault("id", f"{path.stem}-{i}")
    return rows


def iter_rows(path: str | os.PathLike, *, default_ids: bool = True) -> Iterator[Row]:
    """`load_rows`, one row at a time: a JSON lines file (``.jsonl``, or a ``.json`` whose
    first line is a whole row) is read only as far as the rows taken; other files at once."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".json":
        with path.open(encoding="utf-8") as f:
            first = f.readline()
            lazy = bool(first.strip()) and bool(f.readline().strip())  # more than one line
        try:
            lazy = lazy and isinstance(json.loads(first), dict)
        except json.JSONDecodeError:
            lazy = False
    else:
        lazy = suffix == ".jsonl"
    if not lazy:
        yield from load_rows(path, default_ids=default_ids)
        return
    for i, (_, row) in enumerate(json_objects(path, "a task row (a JSON object)")):
        if default_ids:
            row.setdefault("id", f"{path.stem}-{i}")
        yield row


def _json_lines(path: Path, text: str) -> list[Any]:
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON: {exc}") from None
    return rows


class TaskLoader:
    """Endless shuffled batches of task rows with a resumable position."""

    def __init__(self, rows: Sequence[Row], batch_size: int, seed: int = 0,
                 shuffle: bool = True) -> None:
        if not rows:
            raise ValueError("TaskLoader needs at least one task row")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.rows = list(rows)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.index = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self, n: int | None = None) -> list[Row]:
        """The next ``n`` rows (default ``batch_size``), crossing epoch boundaries as needed."""
        n = self.batch_size if n is None else n
        batch = []
        while len(batch) < n:
            if self.index >= len(self._order):
                self.epoch += 1
                self.index = 0
                self._order = self._permutation(self.epoch)
            batch.append(self.rows[self._order[self.index]])
            self.index += 1
        return batch

    def __iter__(self) -> Iterator[list[Row]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])
        self._order = self._permutation(self.epoch)
