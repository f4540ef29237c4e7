"""ToolACE (``Team-ACE/ToolACE``): ``system`` (a prompt that lists the tools as a JSON array)
and ``conversations`` (``{"from": "user" | "assistant" | "tool", "value"}``).

An assistant turn that calls tools is a bracketed list of Python-style calls,
``[Func Name(arg="x", n=2), other()]``: function names may hold spaces and parentheses (the
longest offered name wins), argument names may be keywords (``from``) or start with ``$``,
values are JSON or Python literals. Tool schemas are BFCL-style (``"type": "dict"``).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from toolrl.core.types import ToolCall
from toolrl.data.convert import SkipRecord, conversation_rows, decode_json, require

_ROLES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
          "tool": "tool", "function": "tool", "observation": "tool"}
_JSON_WORDS = re.compile(r"\b(true|false|null)\b")


def tools_from_prompt(system: str) -> list[dict[str, Any]]:
    """The first JSON array of named functions in a system prompt."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\[\s*\{", system):
        try:
            value, _ = decoder.raw_decode(system, match.start())
        except json.JSONDecodeError:
            continue
        if value and all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in value):
            return value
    return []


def literal(text: str) -> Any:
    """A JSON or Python literal (``true``/``false``/``null`` read as JSON)."""
    text = text.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    python = _outside_strings(text, lambda s: _JSON_WORDS.sub(
        lambda m: {"true": "True", "false": "False", "null": "None"}[m.group(1)], s))
    try:
        return ast.literal_eval(python)
    except (ValueError, SyntaxError):
        raise ValueError(f"not a literal value: {text!r}") from None


def _outside_strings(text: str, fn: Any) -> str:
    """Apply ``fn`` to the parts of ``text`` outside quoted strings."""
    out, plain, quote, i = [], [], None, 0
    while i < len(text):
        c = text[i]
        if quote:
            out.append(c)
            if c == "\\" and i + 1 < len(text):
                out.append(text[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            out.append(fn("".join(plain)))
            plain = []
            out.append(c)
            quote = c
        else:
            plain.append(c)
        i += 1
    out.append(fn("".join(plain)))
    return "".join(out)


def _value_end(text: str, start: int) -> int:
    """Index of the ``,`` or ``)`` that ends the argument value starting at ``start``."""
    depth, quote, i = 0, None, start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return i
            depth -= 1
        elif c == "," and depth == 0:
            return i
        i += 1
    raise ValueError(f"unbalanced call text: {text[start:start + 40]!r}")


def parse_bracket_calls(text: str, names: Sequence[str]) -> list[ToolCall] | None:
    """The calls of ``[f(a=1), g()]`` over the offered ``names``; None when the text is not a
    call list (it does not open with an offered name); ValueError when it is, but malformed."""
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    body = body[1:-1]
    by_length = sorted(names, key=len, reverse=True)

    def name_at(pos: int) -> str | None:
        return next((n for n in by_length if body.startswith(n, pos)
                     and body[pos + len(n):].lstrip().startswith("(")), None)

    pos = len(body) - len(body.lstrip())
    if name_at(pos) is None:
        return None
    calls = []
    while True:
        name = name_at(pos)
        if name is None:
            raise ValueError(f"no offered function at {body[pos:pos + 40]!r}")
        pos = body.index("(", pos + len(name)) + 1
        arguments: dict[str, Any] = {}
        while True:
            while pos < len(body) and body[pos] in " \n\t,":
                pos += 1
            if pos >= len(body):
                raise ValueError(f"unclosed call of {name!r}")
            if body[pos] == ")":
                pos += 1
                break
            eq = body.find("=", pos)
            key = body[pos:eq].strip() if eq > 0 else ""
            if not key or any(c in key for c in "()[]{}\"', "):
                raise ValueError(f"{name}: expected name=value at {body[pos:pos + 40]!r}")
            end = _value_end(body, eq + 1)
            arguments[key] = literal(body[eq + 1:end])
            pos = end
        calls.append(ToolCall(name, arguments))
        while pos < len(body) and body[pos] in " \n\t,":
            pos += 1
        if pos >= len(body):
            return calls


def convert_record(record: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """FunctionCalling rows of one ToolACE dialog."""
    require(record, "toolace", "system", "conversations")
    tools = tools_from_prompt(str(record.get("system") or ""))
    if not tools:
        raise SkipRecord("no tools in the system prompt")
    names = [t["name"] for t in tools]
    turns = []
    for turn in decode_json(record["conversations"], "'conversations'"):
        role = _ROLES.get(str(turn.get("from", turn.get("role", ""))))
        value = turn.get("value", turn.get("content", ""))
        if role is None:
            raise ValueError(f"unknown speaker {turn.get('from')!r}")
        if role == "assistant":
            try:
                calls = parse_bracket_calls(str(value), names)
            except ValueError as exc:
                raise ValueError(f"malformed call list {str(value)[:80]!r}: {exc}") from None
            turns.append((role, calls if calls is not None else str(value)))
        else:
            turns.append((role, value))
    return conversation_rows("toolace", record.get("id", index), turns, tools)
