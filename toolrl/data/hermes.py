"""NousResearch hermes-function-calling (``hermes-function-calling-v1``): ShareGPT
``conversations`` (``{"from": "system" | "human" | "gpt" | "tool", "value"}``), with the tools
in a ``tools`` column (JSON) or inside ``<tools> ... </tools>`` of the system prompt, and calls
as ``<tool_call> {"name": ..., "arguments": {...}} </tool_call>`` blocks in the gpt turns (JSON,
or Python dict literals as some of the data writes them). Records without tools (the JSON-mode
subsets) are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from toolrl.core.bfcl import as_tool_call
from toolrl.core.types import ToolCall
from toolrl.data.convert import SkipRecord, conversation_rows, decode_json, require
from toolrl.data.toolace import literal

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
          "tool": "tool", "function": "tool", "observation": "tool"}
_TOOLS = re.compile(r"<tools>(.*?)</tools>", re.DOTALL)
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def hermes_tools(record: Mapping[str, Any], system: str) -> list[Any]:
    """The tools of a record: its ``tools`` column, else the system prompt's ``<tools>``."""
    if record.get("tools"):
        tools = decode_json(record["tools"], "'tools'")
    else:  # the prompt names the tags ("within <tools> </tools> XML tags") before the block
        blocks = [b for b in _TOOLS.findall(system) if b.strip()]
        if not blocks:
            return []
        tools = literal(blocks[-1])
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list):
        raise ValueError(f"tools must be a list, got {type(tools).__name__}")
    return tools


def tool_calls(text: str) -> list[ToolCall]:
    """The ``<tool_call>`` blocks of a gpt turn."""
    calls = []
    for block in _CALL.findall(text):
        value = literal(block)
        if not isinstance(value, dict):
            raise ValueError(f"a <tool_call> block is not an object: {block.strip()[:60]!r}")
        calls.append(as_tool_call(value))
    return calls


def convert_record(record: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """FunctionCalling rows of one Hermes conversation."""
    require(record, "hermes", "conversations")
    conversation = decode_json(record["conversations"], "'conversations'")
    system = "".join(str(t.get("value", "")) for t in conversation
                     if t.get("from", t.get("role")) == "system")
    tools = hermes_tools(record, system)
    if not tools:
        raise SkipRecord("no tools offered")
    turns = []
    for turn in conversation:
        speaker = str(turn.get("from", turn.get("role", "")))
        if speaker == "system":
            continue
        role = _ROLES.get(speaker)
        if role is None:
            raise ValueError(f"unknown speaker {speaker!r}")
        value = str(turn.get("value", turn.get("content", "")))
        if role == "assistant":
            calls = tool_calls(value)
            turns.append((role, calls or value))
        else:
            turns.append((role, value))
    return conversation_rows("hermes", record.get("id", index), turns, tools)
