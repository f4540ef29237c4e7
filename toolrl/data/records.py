"""Building FunctionCalling rows from public datasets' records: OpenAI tool schemas, BFCL
ground truth, conversations cut at each assistant turn, and the checks every converter shares
(`toolrl.data.convert` runs the converters; each format's module builds on these)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
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

Row = dict[str, Any]


class SkipRecord(Exception):
    """A record with nothing to convert (e.g. no tools offered); the message is the reason."""


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
