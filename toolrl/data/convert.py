"""`toolrl data convert`: public function-calling training sets -> FunctionCalling rows.

``--from bfcl`` reads BFCL's own files: single-turn categories as FunctionCalling rows,
multi-turn ones (the four scored categories and the unused ``multi_turn_composite`` set) as
``toolrl/BFCLMultiTurn-v0`` rows (`toolrl.data.bfcl_multi_turn`); ``--from bfcl-multi-turn``
reads your own multi-turn rows in BFCL's shape (their possible answer inline as
``ground_truth`` or in a ``--answers`` file). Either passes the same row check.

``--from toolrl`` reads your own data in the row schema below (`toolrl.data.toolrl_rows`), so
data of any other layout needs only a mapping to that schema, never a converter of its own.

Every format yields the same rows: ``id``, ``env`` (``toolrl/FunctionCalling-v0``), ``source``,
``category`` (`toolrl.core.bfcl.category_of`: by the calls expected and the tools offered),
``messages`` (the conversation up to the answer; the dataset's system prompt, which lists the
tools and its own call syntax, is left out: the env's chat template offers the tools),
``tools`` (OpenAI schemas) and ``ground_truth`` (BFCL possible answers). Multi-turn records give
one row per assistant turn that calls tools, and one ``irrelevance`` row per assistant turn that
answers a user without calling any; turns that follow a tool result are context only.

Ground truth: each argument of the dataset's answer is its acceptable value; an optional
parameter (not in ``required``) whose schema gives a default also accepts being left out (and
the default), since leaving it out means the same call. Every row is checked before it is
written: the dataset's own calls and `ground_truth_calls` must pass the BFCL checker, and the row
must pass `toolrl.data.check_rows`, the check train, eval and the dry run run. A record
that cannot be converted is an error with its index and reason; records with nothing to learn
(no tools offered) are skipped with a counted reason. Nothing is dropped silently, and when no
row is left no output is written.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolrl.data import glaive, hermes, nestful, toolace, toolrl_rows, xlam
from toolrl.data.bfcl import category_from_file, load_bfcl
from toolrl.data.bfcl_multi_turn import is_multi_turn_entry, load_bfcl_multi_turn
from toolrl.data.check import check_rows
from toolrl.data.loader import iter_rows
from toolrl.data.records import SkipRecord

Row = dict[str, Any]


@dataclass
class ConversionReport:
    """What a conversion read, wrote, skipped (by reason) and failed on (index, id, reason)."""

    format: str
    read: int = 0
    written: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    errors: list[tuple[int, Any, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # BFCL's own rows the row check notes

    def summary(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in self.skipped.most_common()) or "none"
        return (f"{self.format}: read {self.read} records, wrote {self.written} rows, "
                f"skipped {sum(self.skipped.values())} ({skipped}), "
                f"{len(self.errors)} errors")

    def error_lines(self, shown: int = 5) -> list[str]:
        """One line per distinct error message (with how many records had it and the first
        of them), the ``shown`` most common."""
        by_message: dict[str, list[tuple[int, Any]]] = {}
        for index, record_id, message in self.errors:
            by_message.setdefault(message, []).append((index, record_id))
        common = sorted(by_message.items(), key=lambda kv: -len(kv[1]))
        lines = []
        for message, where in common[:shown]:
            index, record_id = where[0]
            many = f" (and {len(where) - 1} more with the same error)" if len(where) > 1 else ""
            lines.append(f"error in record {index} (id {record_id!r}){many}: {message}")
        if len(common) > shown:
            lines.append(f"... and {len(common) - shown} other errors")
        return lines


def _load_bfcl_file(fmt: str, path: str | os.PathLike, answers: str | os.PathLike | None,
                    limit: int | None) -> list[Row]:
    """Rows of one BFCL file: a multi-turn one (by its category, or records in BFCL's
    multi-turn shape) as BFCLMultiTurn rows, any other as FunctionCalling rows;
    ``bfcl-multi-turn``: your own rows in BFCL's multi-turn shape."""
    if fmt == "bfcl-multi-turn":
        return load_bfcl_multi_turn(path, answers, limit, own=True)
    category = category_from_file(path) or ""
    first = next(iter_rows(path), {})
    if category.startswith("multi_turn") or is_multi_turn_entry(first):
        return load_bfcl_multi_turn(path, answers, limit)
    return load_bfcl(path, answers, limit=limit)


# --- the command -----------------------------------------------------------------------------
Converter = Callable[[Mapping[str, Any], int], list[Row]]


def formats() -> dict[str, Converter]:
    """Format name -> converter of one record (its index given for ids)."""
    return {"xlam": xlam.convert_record, "toolace": toolace.convert_record,
            "hermes": hermes.convert_record, "glaive": glaive.convert_record,
            "nestful": nestful.convert_record, "toolrl": toolrl_rows.convert_record}


FORMATS = ("xlam", "toolace", "hermes", "glaive", "nestful", "bfcl", "bfcl-multi-turn", "toolrl")


def convert(fmt: str, inputs: Sequence[str | os.PathLike], output: str | os.PathLike, *,
            answers: str | os.PathLike | None = None, limit: int | None = None
            ) -> ConversionReport:
    """Convert ``inputs`` (JSON, JSONL or parquet files of ``fmt``) into ``output`` (JSONL).

    Errors are collected per record (see `ConversionReport`); they are also written next to the
    output as ``<output>.errors.jsonl``. Raises ValueError for an unknown format or output type
    and for BFCL files toolrl cannot score. ``limit``: read at most that many records (JSON
    lines files are read no further). ``nestful`` without inputs reads the default splits of
    the ``nestful-wrapper`` wheel (`toolrl.data.nestful`).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    output = Path(output)
    if output.suffix.lower() != ".jsonl":
        raise ValueError(f"{output}: the output is JSON lines; name it *.jsonl")
    if answers is not None and not fmt.startswith("bfcl"):
        raise ValueError("--answers is for BFCL question files only")
    if not inputs and fmt != "nestful":
        raise ValueError(f"--from {fmt} needs input files")
    report = ConversionReport(fmt)
    rows: list[Row] = []
    if fmt.startswith("bfcl"):
        for path in inputs:
            if limit is not None and report.read >= limit:
                break
            converted = _load_bfcl_file(fmt, path, answers,
                                        None if limit is None else limit - report.read)
            report.read += len(converted)
            rows += converted
        indices = list(range(len(rows)))
    else:
        convert_record = formats()[fmt]
        indices: list[int] = []  # the record of each row
        read = nestful.load_records if fmt == "nestful" else \
            (lambda path: iter_rows(path, default_ids=False))
        for path in inputs or [None]:
            for record in read(path):
                if limit is not None and report.read >= limit:
                    break
                index = report.read
                report.read += 1
                try:
                    converted = convert_record(record, index)
                    rows += converted
                    indices += [index] * len(converted)
                except SkipRecord as skip:
                    report.skipped[str(skip)] += 1
                except (ValueError, KeyError, TypeError) as exc:
                    message = str(exc) if isinstance(exc, ValueError) else \
                        f"{type(exc).__name__}: {exc}"
                    report.errors.append((index, record.get("id"), message))
    if limit is not None and fmt.startswith("bfcl"):
        rows, indices = rows[:limit], indices[:limit]
    checked = check_rows(rows, "rows")  # the check train and eval run: nothing they refuse
    bad = {p.index for p in checked.blocking}
    for problem in checked.blocking:
        report.errors.append((indices[problem.index], problem.row_id,
                              f"{problem.kind}: {problem.reason}"))
    report.errors.sort(key=lambda e: e[0])
    report.notes = [p.line() for p in checked.notes]
    rows = [r for i, r in enumerate(rows) if i not in bad]
    report.written = len(rows)
    if rows:
        output.parent.mkdir(parents=True, exist_ok=True)
        with output.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    errors_path = output.with_name(output.name + ".errors.jsonl")
    if report.errors:
        output.parent.mkdir(parents=True, exist_ok=True)
        with errors_path.open("w", encoding="utf-8") as f:
            for index, record_id, message in report.errors:
                f.write(json.dumps({"index": index, "id": record_id, "error": message}) + "\n")
    elif errors_path.exists():
        errors_path.unlink()
    return report
