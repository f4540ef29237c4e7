"""Plain data types shared by parsing, environments and rewards."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One function call the model made: a tool name and its JSON arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}

    def to_openai(self) -> dict[str, Any]:
        """The message-level form chat templates expect under ``tool_calls``."""
        out: dict[str, Any] = {"type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        if self.id is not None:
            out["id"] = self.id
        return out


def as_tool_call(obj: ToolCall | Mapping[str, Any]) -> ToolCall:
    """A ToolCall from a ToolCall, ``{"name", "arguments", "id"}`` or OpenAI
    ``{"function": {...}}``.

    ``arguments`` may be a JSON string (OpenAI style); it is decoded.
    """
    if isinstance(obj, ToolCall):
        return obj
    if not isinstance(obj, Mapping):
        raise ValueError(f"a call must be an object with 'name' and 'arguments', got {obj!r}")
    fn = obj["function"] if isinstance(obj.get("function"), Mapping) else obj
    name = fn.get("name")
    if not isinstance(name, str):
        raise ValueError(f"a call needs a string 'name', got {obj!r}")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"call {name!r}: arguments are not valid JSON: {exc}") from None
    if args is None:
        args = {}
    return ToolCall(name=name, arguments=args, id=obj.get("id"))


@dataclass(frozen=True)
class ParseError:
    """A structured reason why part of a message was not a valid tool call."""

    kind: str  # e.g. "invalid_json", "unclosed_tag", "missing_name", "bad_arguments"
    message: str
    span: tuple[int, int] | None = None  # character offsets in the message text


@dataclass(frozen=True)
class ParseResult:
    """What a tool-call format extracted from one assistant message."""

    calls: list[ToolCall]
    text: str  # the free text outside tool calls
    errors: list[ParseError] = field(default_factory=list)
    repaired: bool = False  # True when a json-repair fallback was needed (rewards may penalize)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data; `from_dict` restores an equal ParseResult."""
        return {"calls": [{"name": c.name, "arguments": c.arguments, "id": c.id}
                          for c in self.calls],
                "text": self.text, "repaired": self.repaired,
                "errors": [{"kind": e.kind, "message": e.message,
                            "span": None if e.span is None else list(e.span)}
                           for e in self.errors]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParseResult:
        errors = [ParseError(kind=e["kind"], message=e.get("message", ""),
                             span=None if e.get("span") is None else
                             (int(e["span"][0]), int(e["span"][1])))
                  for e in data.get("errors") or []]
        return cls(calls=[as_tool_call(c) for c in data.get("calls") or []],
                   text=data.get("text") or "", errors=errors,
                   repaired=bool(data.get("repaired", False)))


# Typed error kinds an episode reports in ``info["errors"]`` (each error is a dict with ``type``,
# ``tool`` and ``message``; the model sees the same dict as a short JSON observation).
ERROR_TYPES: frozenset[str] = frozenset({
    "parse_error",       # the message held a malformed tool call
    "unknown_tool",      # the call names no tool of this episode
    "missing_required",  # a required argument is absent
    "wrong_type",        # an argument has the wrong JSON type
    "unknown_param",     # an argument the schema does not declare
    "enum_mismatch",     # a value outside the schema's enum/const
    "invalid_value",     # any other schema violation (range, pattern, length, ...)
    "timeout",           # the tool did not finish within its time limit
    "tool_exception",    # the tool raised; the message names the exception type
    "output_truncated",  # the output was cut to the size cap (the call itself succeeded)
    "http_error",        # an HTTP tool got a 4xx/5xx answer
    "too_many_calls",    # more calls in one turn than the env runs (only the first ones ran)
})
