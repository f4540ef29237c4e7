"""Glaive function calling (``glaive-function-calling-v2``): ``system`` (``SYSTEM: You are a
helpful assistant with access to the following functions. Use them if required -`` followed by
one JSON object per function) and ``chat``, one string of ``USER:``, ``ASSISTANT:`` and
``FUNCTION RESPONSE:`` turns. A call is ``<functioncall> {"name": "...", "arguments": '{...}'}``
(the arguments a JSON string in single quotes); turns end with ``<|endoftext|>``. Records whose
system prompt offers no function are skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from toolrl.core.types import ToolCall
from toolrl.data.convert import SkipRecord, conversation_rows, require

_TURN = re.compile(r"(?:^|\n)\s*(USER|ASSISTANT|FUNCTION RESPONSE):", re.MULTILINE)
_ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}
_CALL = re.compile(r"<functioncall>\s*(.*)", re.DOTALL)
_QUOTED_ARGS = re.compile(r'^\{\s*"name"\s*:\s*"(?P<name>[^"]*)"\s*,\s*"arguments"\s*:\s*'
                          r"'(?P<args>.*)'\s*\}$", re.DOTALL)


def functions_from_system(system: str) -> list[dict[str, Any]]:
    """Every JSON object with a ``name`` in the system prompt, in order."""
    decoder = json.JSONDecoder()
    out, pos = [], system.find("{")
    while pos != -1:
        try:
            value, end = decoder.raw_decode(system, pos)
        except json.JSONDecodeError:
            pos = system.find("{", pos + 1)
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            out.append(value)
        pos = system.find("{", end)
    return out


def parse_functioncall(text: str) -> ToolCall:
    """One ``<functioncall>`` payload."""
    text = text.strip()
    match = _QUOTED_ARGS.match(text)
    if match:
        try:
            arguments = json.loads(match.group("args")) if match.group("args").strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"functioncall arguments are not JSON: {exc}") from None
        return ToolCall(match.group("name"), arguments)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"not a functioncall: {text[:80]!r}") from None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    return ToolCall(value["name"], arguments)


def chat_turns(chat: str) -> list[tuple[str, str]]:
    """``(role, text)`` of a Glaive chat string, end-of-text markers removed."""
    marks = list(_TURN.finditer(chat))
    if not marks:
        raise ValueError("the chat has no USER:/ASSISTANT: turns")
    turns = []
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        end = following.start() if following else len(chat)
        text = chat[mark.end():end].replace("<|endoftext|>", "").strip()
        turns.append((_ROLES[mark.group(1)], text))
    return turns


def convert_record(record: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """FunctionCalling rows of one Glaive conversation."""
    require(record, "glaive", "system", "chat")
    tools = functions_from_system(str(record.get("system") or ""))
    if not tools:
        raise SkipRecord("no functions offered")
    turns: list[tuple[str, Any]] = []
    for role, text in chat_turns(str(record["chat"])):
        call = _CALL.search(text) if role == "assistant" else None
        if call:
            turns.append((role, [parse_functioncall(call.group(1))]))
        else:
            turns.append((role, text))
    return conversation_rows("glaive", record.get("id", index), turns, tools)
