"""``--from toolrl``: your own data in the FunctionCalling row schema, checked and completed.

One record (a JSON object in a ``.json`` list, a ``.jsonl`` line or a parquet row):

- ``messages`` (OpenAI chat messages up to the answer) or ``question`` (one user message);
- ``tools``: OpenAI tools (``{"type": "function", "function": {...}}``) or bare functions
  (``{"name", "description", "parameters"}``), parameters in JSON Schema (enums, defaults,
  nested objects and arrays as JSON Schema writes them);
- the answer, one of: ``calls``, the concrete calls of the answer turn
  (``[{"name", "arguments"}]``, arguments an object or a JSON string; toolrl derives BFCL
  possible answers, where an optional parameter with a default may also be left out), or
  ``ground_truth``, BFCL possible answers written by hand (``[{fn: {param: [acceptable
  values]}}]``, ``""`` among the values: may be omitted). Neither, or an empty list: the
  answer is no call (``irrelevance``);
- optional: ``id`` (default ``toolrl-<index>``), ``category`` (default from the calls and
  tools: simple, multiple, parallel, parallel_multiple, irrelevance), ``env`` (default
  ``toolrl/FunctionCalling-v0``) and ``env_kwargs`` (that env's constructor arguments for this
  row), ``source``.

The calls of a row are made in one assistant turn, in any order, and checked by BFCL's AST
checker; nothing is executed. So a *sequence* of dependent calls, where a later call's
arguments use an earlier call's output (NESTFUL writes them as ``"$var1.distance$"`` with
``"label": "var1"`` on the earlier call), cannot be scored by FunctionCalling: such a record is
refused with that reason. Keep the calls that use no earlier output, or train the sequence in
an env that executes its tools (``toolrl/HttpApi-v0``, ``toolrl/Mcp-v0`` or your own).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from toolrl.core.bfcl import as_tool_call, category_of
from toolrl.data.bfcl import FUNCTION_CALLING_ENV
from toolrl.data.records import decode_json, ground_truth_of, openai_tool

_REFERENCE = re.compile(r"\$([A-Za-z_][\w-]*)(?:[.\[][^$]*)?\$")


def convert_record(record: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """The FunctionCalling row of one record in the schema above (a ValueError says what is
    missing or why it cannot be scored)."""
    if "messages" in record:
        messages = decode_json(record["messages"], "'messages'")
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list of chat messages")
    elif isinstance(record.get("question"), str) and record["question"].strip():
        messages = [{"role": "user", "content": record["question"]}]
    else:
        raise ValueError(f"no 'messages' and no 'question' (fields: "
                         f"{', '.join(map(repr, record))}): is this toolrl row data?")
    tools = decode_json(record.get("tools"), "'tools'")
    if not isinstance(tools, list):
        raise ValueError("'tools' must be a list of OpenAI tools or functions")
    tools = [openai_tool(_tool(t, i)) for i, t in enumerate(tools)]
    if "ground_truth" in record and "calls" in record:
        raise ValueError("give 'calls' or 'ground_truth', not both")
    if "ground_truth" in record:
        truth = decode_json(record["ground_truth"], "'ground_truth'")
        if not isinstance(truth, list):
            raise ValueError("'ground_truth' must be a list of possible answers")
    else:
        calls = decode_json(record.get("calls") or [], "'calls'")
        if not isinstance(calls, list):
            raise ValueError("'calls' must be a list of {name, arguments}")
        _refuse_dependent(calls)
        truth = ground_truth_of([as_tool_call(c) for c in calls], tools)
    row: dict[str, Any] = {
        "id": record.get("id", f"toolrl-{index}"),
        "env": record.get("env") or FUNCTION_CALLING_ENV,
        "source": record.get("source") or "toolrl",
        "category": record.get("category") or category_of(len(truth), len(tools)),
        "messages": messages, "tools": tools, "ground_truth": truth}
    if record.get("env_kwargs"):
        if not isinstance(record["env_kwargs"], Mapping):
            raise ValueError("'env_kwargs' must be an object of the env's constructor arguments")
        row["env_kwargs"] = dict(record["env_kwargs"])
    return [row]


def _tool(tool: Any, index: int) -> Mapping[str, Any]:
    if not isinstance(tool, Mapping):
        raise ValueError(f"tool {index} is {type(tool).__name__}, not an object")
    function = tool.get("function", tool) if tool.get("type") == "function" else tool
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or \
            not function["name"]:
        fields = ", ".join(map(repr, function)) if isinstance(function, Mapping) else "none"
        raise ValueError(f"tool {index} has no 'name' (fields: {fields})")
    return tool


def _refuse_dependent(calls: list[Any]) -> None:
    """A call whose arguments use an earlier call's output: one clear ValueError."""
    labels: dict[str, int] = {}
    for i, call in enumerate(calls):
        if not isinstance(call, Mapping):
            raise ValueError(f"call {i} is not an object {{name, arguments}}")
        text = json.dumps(call.get("arguments"))
        for match in _REFERENCE.finditer(text):
            if match.group(1) in labels:
                earlier = labels[match.group(1)]
                whose = f"call {earlier} ({calls[earlier].get('name')!r})"
                raise ValueError(
                    f"call {i} ({call.get('name')!r}) uses the output of {whose} "
                    f"({match.group(0)!r}): a FunctionCalling row is one turn of independent "
                    f"calls and runs no tool, so dependent calls cannot be scored; keep the "
                    f"calls that use no earlier output, or train the sequence in an env that "
                    f"executes its tools")
        if isinstance(call.get("label"), str):
            labels[call["label"]] = i
