"""`toolrl data convert`: public function-calling training sets -> FunctionCalling rows.

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
written: the dataset's own calls and `ground_truth_calls` must pass the BFCL checker. A record
that cannot be converted is an error with its index and reason; records with nothing to learn
(no tools offered) are skipped with a counted reason. Nothing is dropped silently.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolrl.core.bfcl import (
    category_of,
    check_calls,
    ground_truth_calls,
    possible_answer,
    tool_schemas,
)
from toolrl.core.types import ToolCall
from toolrl.data.bfcl import FUNCTION_CALLING_ENV
from toolrl.data.loader import load_rows

Row = dict[str, Any]


class SkipRecord(Exception):
    """A record with nothing to convert (e.g. no tools offered); the message is the reason."""


@dataclass
class ConversionReport:
    """What a conversion read, wrote, skipped (by reason) and failed on (index, id, reason)."""

    format: str
    read: int = 0
    written: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    errors: list[tuple[int, Any, str]] = field(default_factory=list)

    def summary(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in self.skipped.most_common()) or "none"
        return (f"{self.format}: read {self.read} records, wrote {self.written} rows, "
                f"skipped {sum(self.skipped.values())} ({skipped}), "
                f"{len(self.errors)} errors")


# --- building rows ---------------------------------------------------------------------------
def openai_tool(function: Mapping[str, Any]) -> dict[str, Any]:
    """``{"type": "function", "function": ...}`` from a bare or already wrapped function."""
    if function.get("type") == "function" and isinstance(function.get("function"), Mapping):
        function = function["function"]
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise ValueError(f"a tool without a name: {function!r}")
    out = dict(function)
    params = out.get("parameters")
    if params is None or params == {}:
        out["parameters"] = {"type": "object", "properties": {}}
    elif not isinstance(params, Mapping):
        raise ValueError(f"tool {out['name']!r}: parameters must be an object")
    return {"type": "function", "function": out}


def ground_truth_of(calls: Sequence[ToolCall], tools: Sequence[Mapping[str, Any]]) -> list[Row]:
    """BFCL possible answers for the dataset's answer ``calls`` (see the module docstring)."""
    schemas = tool_schemas(tools)
    out = []
    for call in calls:
        if call.name not in schemas:
            raise ValueError(f"the answer calls {call.name!r}, which is not among the tools "
                             f"offered ({', '.join(schemas) or 'none'})")
        if not isinstance(call.arguments, Mapping):
            raise ValueError(f"the answer's arguments of {call.name!r} are not an object")
        schema = schemas[call.name]
        answer = possible_answer(call, schema)[call.name]
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        for param, prop in props.items():
            default = prop.get("default") if isinstance(prop, Mapping) else None
            if param in required or default is None or default == "":
                continue
            value = possible_answer(ToolCall(call.name, {param: default}), schema)[
                call.name][param][0]
            if param not in answer:
                answer[param] = [value, ""]
            elif answer[param][0] == value:
                answer[param].append("")
        out.append({call.name: answer})
    return out


def function_row(source: str, row_id: str, messages: list[Row],
                 tools: Sequence[Mapping[str, Any]], calls: Sequence[ToolCall]) -> Row:
    """One checked FunctionCalling row (raises ValueError when its ground truth would not
    accept the dataset's own calls, or the oracle's)."""
    tools = [openai_tool(t) for t in tools]
    truth = ground_truth_of(calls, tools)
    category = category_of(len(calls), len(tools))
    for who, candidate in (("the dataset's answer", list(calls)),
                           ("the ground-truth call", ground_truth_calls(truth, tools))):
        verdict = check_calls(candidate, truth, category, tools)
        if not verdict.valid:
            raise ValueError(f"{who} fails the BFCL check against its tools: {verdict.error}")
    return {"id": row_id, "env": FUNCTION_CALLING_ENV, "source": source, "category": category,
            "messages": messages, "tools": tools, "ground_truth": truth}


def assistant_calls_message(calls: Sequence[ToolCall]) -> Row:
    """An assistant turn of the history that called tools, in OpenAI message form."""
    return {"role": "assistant", "content": "", "tool_calls": [c.to_openai() for c in calls]}


def conversation_rows(source: str, record_id: Any, turns: Iterable[tuple[str, Any]],
                      tools: Sequence[Mapping[str, Any]]) -> list[Row]:
    """Rows of a multi-turn record. ``turns`` are ``("user", text)``, ``("assistant", calls or
    text)`` (a list of ToolCall when the turn calls tools) and ``("tool", text)``."""
    rows: list[Row] = []
    history: list[Row] = []
    previous = None
    for role, content in turns:
        if role == "assistant":
            if isinstance(content, list) and content:
                rows.append(function_row(source, f"{source}-{record_id}-{len(rows)}",
                                         list(history), tools, content))
                history.append(assistant_calls_message(content))
            else:
                text = content if isinstance(content, str) else ""
                if previous == "user":  # answers the user without a call
                    rows.append(function_row(source, f"{source}-{record_id}-{len(rows)}",
                                             list(history), tools, []))
                history.append({"role": "assistant", "content": text})
        elif role in ("user", "tool"):
            history.append({"role": role, "content": content if isinstance(content, str)
                            else json.dumps(content)})
        else:
            raise ValueError(f"unknown turn role {role!r}")
        previous = role
    if not rows:
        raise SkipRecord("no assistant answer")
    return rows


def require(record: Mapping[str, Any], fmt: str, *keys: str) -> None:
    """A record lacking one of the format's fields is an error (wrong ``--from``?)."""
    missing = [k for k in keys if k not in record]
    if missing:
        raise ValueError(f"no field {', '.join(map(repr, missing))} (fields: "
                         f"{', '.join(map(repr, record))}): is this {fmt} data?")


def decode_json(value: Any, what: str) -> Any:
    """A field stored as a JSON string (as HF parquet exports do) or already decoded."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{what} is not valid JSON: {exc}") from None
    return value


# --- the command -----------------------------------------------------------------------------
Converter = Callable[[Mapping[str, Any], int], list[Row]]


def formats() -> dict[str, Converter]:
    """Format name -> converter of one record (its index given for ids)."""
    from toolrl.data import glaive, hermes, toolace, xlam

    return {"xlam": xlam.convert_record, "toolace": toolace.convert_record,
            "hermes": hermes.convert_record, "glaive": glaive.convert_record}


FORMATS = ("xlam", "toolace", "hermes", "glaive", "bfcl")


def convert(fmt: str, inputs: Sequence[str | os.PathLike], output: str | os.PathLike, *,
            answers: str | os.PathLike | None = None, limit: int | None = None
            ) -> ConversionReport:
    """Convert ``inputs`` (JSON, JSONL or parquet files of ``fmt``) into ``output`` (JSONL).

    Errors are collected per record (see `ConversionReport`); they are also written next to the
    output as ``<output>.errors.jsonl``. Raises ValueError for an unknown format or output type
    and for BFCL files toolrl cannot score.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    output = Path(output)
    if output.suffix.lower() != ".jsonl":
        raise ValueError(f"{output}: the output is JSON lines; name it *.jsonl")
    if answers is not None and fmt != "bfcl":
        raise ValueError("--answers is for BFCL question files only")
    report = ConversionReport(fmt)
    rows: list[Row] = []
    if fmt == "bfcl":
        from toolrl.data.bfcl import load_bfcl

        for path in inputs:
            converted = load_bfcl(path, answers)
            report.read += len(converted)
            rows += converted
    else:
        convert_record = formats()[fmt]
        for path in inputs:
            for record in load_rows(path, default_ids=False):
                if limit is not None and report.read >= limit:
                    break
                index = report.read
                report.read += 1
                try:
                    rows += convert_record(record, index)
                except SkipRecord as skip:
                    report.skipped[str(skip)] += 1
                except (ValueError, KeyError, TypeError) as exc:
                    message = str(exc) if isinstance(exc, ValueError) else \
                        f"{type(exc).__name__}: {exc}"
                    report.errors.append((index, record.get("id"), message))
    if limit is not None:
        rows = rows[:limit] if fmt == "bfcl" else rows
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    report.written = len(rows)
    errors_path = output.with_name(output.name + ".errors.jsonl")
    if report.errors:
        with errors_path.open("w", encoding="utf-8") as f:
            for index, record_id, message in report.errors:
                f.write(json.dumps({"index": index, "id": record_id, "error": message}) + "\n")
    elif errors_path.exists():
        errors_path.unlink()
    return report
