"""Tool-call formats: parse an assistant message into calls + free text, and render calls back.

Each format is a small class registered in ``FORMATS`` (a `toolrl.registry.Registry`):

- ``hermes``: Qwen2.5/Qwen3 style, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  several per message, free text around them. Renders in the compact form the tiny model's
  chat template produces, so render -> parse round-trips.
- ``json``: the message starts with a bare JSON call object or a list of them (optionally in a
  ```` ```json ```` fence); text after the JSON is free text.
- ``llama3_json``: Llama 3.1 ``{"name": ..., "parameters": {...}}`` objects separated by ``;``,
  optionally after ``<|python_tag|>``.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`` (and the newer
  ``[TOOL_CALLS]name[ARGS]{...}`` form when parsing).
- ``deepseek``: DeepSeek-R1 / V3's ``<｜tool▁calls▁begin｜>`` block: each call
  ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` then its arguments in a ```` ```json ````
  fence, ``<｜tool▁call▁end｜>``; the calls joined by newlines, ``<｜tool▁calls▁end｜>`` after the
  last. Text before the block (a ``<think>`` block too) is free text.

Parsing never raises and runs in time linear in the message length (``str.find`` scans and one
``json`` decode per call, no backtracking regexes); arguments nested deeper than
``MAX_ARGUMENT_DEPTH`` levels are rejected (``too_deep``). Malformed calls become `ParseError`
entries; nothing is silently repaired. With ``repair=True`` a lenient decoder is tried on JSON
that fails to parse, and the result is flagged ``repaired=True`` so rewards can penalize it.
"""

from __future__ import annotations

import ast
import json
from typing import Any, ClassVar

from toolrl.core.types import ParseError, ParseResult, ToolCall
from toolrl.registry import Registry

__all__ = [
    "FORMATS",
    "DeepSeekFormat",
    "HermesFormat",
    "JsonFormat",
    "Llama3JsonFormat",
    "MistralFormat",
    "ToolCallFormat",
    "get_format",
]

FORMATS: Registry[type[ToolCallFormat]] = Registry("tool-call format")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


# strict=False accepts raw control characters (e.g. newlines in code strings); NaN/Infinity are
# rejected because they are not JSON and break equality of arguments, and so are numbers that
# overflow a float (``1e400``). Integers longer than Python's 4300-digit limit fail to decode.
_DECODER = json.JSONDecoder(strict=False, parse_constant=_reject_constant,
                            parse_float=_finite_float)
# Arguments nested deeper than this are a parse error: recursive code downstream (validation,
# episode records, pickling to other processes, JSON dumps) must never meet a RecursionError.
MAX_ARGUMENT_DEPTH = 32


def _dumps(obj: Any) -> str:
    """The compact form chat templates emit with ``tojson``: ``{"a": 1, "b": 2}``."""
    return json.dumps(obj, ensure_ascii=False)


class ToolCallFormat:
    """Base class of tool-call formats: ``parse(text) -> ParseResult``, ``render(calls, text)``.

    Args:
        repair: when JSON fails to decode, try a lenient decoder and flag ``repaired=True``.
    """

    name: ClassVar[str] = ""

    def __init__(self, repair: bool = False) -> None:
        self.repair = repair

    def parse(self, text: str) -> ParseResult:
        """Extract calls, free text and structured errors; never raises."""
        if not isinstance(text, str):
            return ParseResult(calls=[], text="", errors=[ParseError(
                "not_text", f"expected a string message, got {type(text).__name__}")])
        try:
            return self._parse(text)
        except RecursionError:  # absurdly deep JSON nesting
            return ParseResult(calls=[], text=text.strip(), errors=[ParseError(
                "invalid_json", "JSON nested too deeply")])

    def render(self, calls: list[ToolCall], text: str = "") -> str:
        """The assistant message text that makes these calls (after ``text``)."""
        raise TypeError(f"{type(self).__name__} does not implement render()")

    def _parse(self, text: str) -> ParseResult:
        raise TypeError(f"{type(self).__name__} does not implement _parse()")

    # --- shared helpers ----------------------------------------------------------------------
    def _decode(self, body: str, offset: int) -> tuple[Any, bool, ParseError | None]:
        """Decode one JSON value filling ``body``: (value, repaired, error)."""
        stripped = body.strip()
        try:
            return _DECODER.decode(stripped), False, None
        except (ValueError, RecursionError) as exc:
            error = ParseError("invalid_json", _json_message(exc), (offset, offset + len(body)))
        if self.repair:
            value = _lenient_decode(stripped)
            if value is not None:
                return value, True, None
        return None, False, error

    @staticmethod
    def _call_from(obj: Any, span: tuple[int, int], args_keys: tuple[str, ...] = ("arguments",
                   "parameters")) -> tuple[ToolCall | None, ParseError | None]:
        """Validate the shape of one decoded call object."""
        if not isinstance(obj, dict):
            return None, ParseError("not_an_object",
                                    f"a tool call must be a JSON object, got {_json_type(obj)}",
                                    span)
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            return None, ParseError("missing_name", "a tool call needs a non-empty string 'name'",
                                    span)
        arguments: Any = {}
        for key in args_keys:
            if key in obj:
                arguments = obj[key]
                break
        if isinstance(arguments, str):  # OpenAI-style JSON-encoded arguments
            try:
                arguments = _DECODER.decode(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError) as exc:
                return None, ParseError("bad_arguments",
                                        f"arguments of {name!r} are a string that is not JSON: "
                                        f"{_json_message(exc)}", span)
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return None, ParseError("bad_arguments",
                                    f"arguments of {name!r} must be a JSON object, got "
                                    f"{_json_type(arguments)}", span)
        if _nesting_exceeds(arguments, MAX_ARGUMENT_DEPTH):
            return None, ParseError("too_deep", f"arguments of {name!r} nest deeper than "
                                                f"{MAX_ARGUMENT_DEPTH} levels", span)
        call_id = obj.get("id")
        return ToolCall(name=name, arguments=arguments,
                        id=call_id if isinstance(call_id, str) else None), None


def _nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether objects/arrays in ``value`` nest more than ``limit`` levels (no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(
            node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", int: "number",
            float: "number"}.get(type(value), type(value).__name__)


def _json_message(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON: {exc.msg} at char {exc.pos}"
    if isinstance(exc, RecursionError):
        return "invalid JSON: nested too deeply"
    return f"invalid JSON: {exc}"


def _lenient_decode(text: str) -> Any:
    """Best-effort repair of almost-JSON (truncated, Python literals, single quotes)."""
    if len(text) > 100_000:
        return None
    try:  # truncated JSON: close open strings/brackets
        # lazy: partial_json_parser is optional (it comes with vLLM)
        from partial_json_parser import loads as partial_loads

        value = partial_loads(text)
        if isinstance(value, (dict, list)):
            return value
    except Exception:  # the optional repair library failed or is absent: try the next one
        pass
    try:  # single quotes, True/False/None
        value = ast.literal_eval(text)
    except Exception:  # any failure means "cannot repair"
        return None
    try:
        _DECODER.decode(json.dumps(value))  # must be representable as JSON
    except (TypeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, (dict, list)) else None


def _join_text(parts: list[str]) -> str:
    return "".join(parts).strip()


@FORMATS.register("hermes")
class HermesFormat(ToolCallFormat):
    """``<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>`` (Qwen/Hermes)."""

    name = "hermes"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def _parse(self, text: str) -> ParseResult:
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        outside: list[str] = []
        repaired = False
        n, pos = len(text), 0
        close_at = -2  # cached position of the next closing tag (-1: none left, -2: unknown)
        while True:
            start = text.find(self.open_tag, pos)
            segment_end = n if start == -1 else start
            stray = text.find(self.close_tag, pos, segment_end)
            if stray != -1:
                errors.append(ParseError("stray_close_tag",
                                         f"{self.close_tag} without a matching {self.open_tag}",
                                         (stray, stray + len(self.close_tag))))
            outside.append(text[pos:segment_end])
            if start == -1:
                break
            body_start = start + len(self.open_tag)
            if close_at != -1 and close_at < body_start:
                close_at = text.find(self.close_tag, body_start)
            next_open = text.find(self.open_tag, body_start)
            # A second opening tag before the close means this call was never closed.
            closed = close_at != -1 and (next_open == -1 or close_at < next_open)
            body_end = close_at if closed else (n if next_open == -1 else next_open)
            span = (start, body_end + (len(self.close_tag) if closed else 0))
            if not closed:
                errors.append(ParseError("unclosed_tag", f"{self.open_tag} is never closed", span))
            body = text[body_start:body_end]
            if body.strip():
                value, fixed, error = self._decode(body, body_start)
                if error is not None:
                    errors.append(error)
                else:
                    call, error = self._call_from(value, span)
                    if error is not None:
                        errors.append(error)
                    elif closed or self.repair:
                        calls.append(call)
                        repaired |= fixed or not closed
            elif closed:
                errors.append(ParseError("empty_call", "empty <tool_call></tool_call>", span))
            pos = span[1]
        return ParseResult(calls=calls, text=_join_text(outside), errors=errors,
                           repaired=repaired)

    def render(self, calls: list[ToolCall], text: str = "") -> str:
        bodies = []
        for c in calls:
            body = _dumps({"name": c.name, "arguments": c.arguments})
            if self.open_tag in body or self.close_tag in body:  # a tag inside a JSON string
                body = body.replace("<", "\\u003c")  # still the same JSON, no tag in the text
            bodies.append(f"{self.open_tag}{body}{self.close_tag}")
        return f"{text}{''.join(bodies)}"


def _strip_fence(text: str) -> str:
    """Remove a leading ```json fence line and its closing fence."""
    stripped = text.lstrip()
    if not stripped.startswith("```"):
        return text
    newline = stripped.find("\n")
    if newline == -1:
        return text
    body = stripped[newline + 1:]
    close = body.rfind("```")
    return body[:close] + body[close + 3:] if close != -1 else body


class _LeadingJsonFormat(ToolCallFormat):
    """Formats where the calls are JSON at the start of the message and free text follows."""

    args_key = "arguments"

    def _decode_at(self, s: str, idx: int) -> tuple[Any, int, bool, ParseError | None]:
        """Decode one JSON value starting at ``s[idx]``: (value, end index, repaired, error)."""
        try:
            value, end = _DECODER.raw_decode(s, idx)
            return value, end, False, None
        except (ValueError, RecursionError) as exc:
            error = ParseError("invalid_json", _json_message(exc), (idx, len(s)))
        if self.repair:
            value = _lenient_decode(s[idx:].strip())
            if value is not None:
                return value, len(s), True, None
        return None, len(s), False, error

    def _calls_from_value(self, value: Any, span: tuple[int, int],
                          calls: list[ToolCall], errors: list[ParseError]) -> None:
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not value:
            errors.append(ParseError("empty_call", "empty list of tool calls", span))
        for item in items:
            call, error = self._call_from(item, span)
            if error is not None:
                errors.append(error)
            else:
                calls.append(call)

    def render(self, calls: list[ToolCall], text: str = "") -> str:
        if not calls:
            return text
        objs = [{"name": c.name, self.args_key: c.arguments} for c in calls]
        body = _dumps(objs[0] if len(objs) == 1 else objs)
        return f"{body}\n{text}" if text else body


def _skip_space(text: str, pos: int, extra: str = "") -> int:
    n = len(text)
    while pos < n and (text[pos].isspace() or text[pos] in extra):
        pos += 1
    return pos


@FORMATS.register("json")
class JsonFormat(_LeadingJsonFormat):
    """A bare JSON call object or list of them, optionally fenced; trailing text is free text."""

    name = "json"

    def _parse(self, text: str) -> ParseResult:
        body = _strip_fence(text)
        start = _skip_space(body, 0)
        if start >= len(body) or body[start] not in "{[":
            return ParseResult(calls=[], text=text.strip())
        value, end, repaired, error = self._decode_at(body, start)
        if error is not None:
            return ParseResult(calls=[], text=text.strip(), errors=[error])
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        self._calls_from_value(value, (start, end), calls, errors)
        return ParseResult(calls=calls, text=body[end:].strip(), errors=errors,
                           repaired=repaired)


@FORMATS.register("llama3_json")
class Llama3JsonFormat(_LeadingJsonFormat):
    """Llama 3.1 JSON calls: ``{"name": ..., "parameters": {...}}`` separated by ``;``."""

    name = "llama3_json"
    args_key = "parameters"
    python_tag = "<|python_tag|>"

    def _parse(self, text: str) -> ParseResult:
        prefix, pos = "", _skip_space(text, 0)
        if pos >= len(text) or text[pos] != "{":
            tag = text.find(self.python_tag)
            if tag == -1:
                return ParseResult(calls=[], text=text.strip())
            prefix, pos = text[:tag], tag + len(self.python_tag)
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        repaired = False
        while True:
            pos = _skip_space(text, pos, ";")
            if pos >= len(text) or text[pos] not in "{[":
                break
            value, end, fixed, error = self._decode_at(text, pos)
            repaired |= fixed
            if error is not None:
                errors.append(error)
                pos = len(text)
                break
            self._calls_from_value(value, (pos, end), calls, errors)
            pos = end
        return ParseResult(calls=calls, text=(prefix + text[pos:]).strip(), errors=errors,
                           repaired=repaired)

    def render(self, calls: list[ToolCall], text: str = "") -> str:
        if not calls:
            return text
        body = "; ".join(_dumps({"name": c.name, "parameters": c.arguments}) for c in calls)
        return f"{text}{self.python_tag}{body}" if text else body


@FORMATS.register("mistral")
class MistralFormat(_LeadingJsonFormat):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``; also ``[TOOL_CALLS]name[ARGS]{...}``."""

    name = "mistral"
    marker = "[TOOL_CALLS]"
    args_marker = "[ARGS]"

    def _parse(self, text: str) -> ParseResult:
        first = text.find(self.marker)
        if first == -1:
            return ParseResult(calls=[], text=text.strip())
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        repaired = False
        prefix = text[:first]
        pos = first
        while text.startswith(self.marker, pos):
            pos = _skip_space(text, pos + len(self.marker))
            if pos < len(text) and text[pos] in "[{":
                value, end, fixed, error = self._decode_at(text, pos)
                repaired |= fixed
                if error is not None:
                    errors.append(error)
                    pos = len(text)
                    break
                self._calls_from_value(value, (pos, end), calls, errors)
                pos = end
            else:  # v11+: name[ARGS]{...}
                args_at = text.find(self.args_marker, pos)
                next_marker = text.find(self.marker, pos)
                if args_at == -1 or (next_marker != -1 and next_marker < args_at):
                    errors.append(ParseError("missing_arguments",
                                             f"{self.marker} without {self.args_marker} or JSON",
                                             (pos, len(text))))
                    pos = len(text) if next_marker == -1 else next_marker
                    continue
                name = text[pos:args_at].strip()
                start = _skip_space(text, args_at + len(self.args_marker))
                value, end, fixed, error = self._decode_at(text, start)
                repaired |= fixed
                if error is not None:
                    errors.append(error)
                    pos = len(text)
                    break
                call, error = self._call_from({"name": name, "arguments": value}, (pos, end))
                if error is not None:
                    errors.append(error)
                else:
                    calls.append(call)
                pos = end
            pos = _skip_space(text, pos)
        return ParseResult(calls=calls, text=(prefix + text[pos:]).strip(), errors=errors,
                           repaired=repaired)

    def render(self, calls: list[ToolCall], text: str = "") -> str:
        if not calls:
            return text
        objs = []
        for c in calls:
            obj: dict[str, Any] = {"name": c.name, "arguments": c.arguments}
            if c.id is not None:
                obj["id"] = c.id
            objs.append(obj)
        return f"{text}{self.marker}{_dumps(objs)}"


@FORMATS.register("deepseek")
class DeepSeekFormat(ToolCallFormat):
    """DeepSeek's calls: ``<｜tool▁calls▁begin｜>``, then per call (newline-joined)
    ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\\n```json\\n{"a": 1}\\n```
    <｜tool▁call▁end｜>`` (no newline before the last marker), then ``<｜tool▁calls▁end｜>``.

    Parsing accepts a missing ``<｜tool▁calls▁end｜>`` at the end of the message (a model that
    stopped on it as a stop string), arguments with or without the ```` ```json ```` fence, and
    any call type before ``<｜tool▁sep｜>`` (``function`` is the only one rendered).
    """

    name = "deepseek"
    calls_begin = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
    calls_end = "<\uff5ctool\u2581calls\u2581end\uff5c>"
    call_begin = "<\uff5ctool\u2581call\u2581begin\uff5c>"
    call_end = "<\uff5ctool\u2581call\u2581end\uff5c>"
    sep = "<\uff5ctool\u2581sep\uff5c>"

    def _parse(self, text: str) -> ParseResult:
        start = text.find(self.calls_begin)
        if start == -1:
            stray = text.find(self.call_begin)
            errors = [] if stray == -1 else [ParseError(
                "unclosed_tag", f"{self.call_begin} outside a {self.calls_begin} block",
                (stray, len(text)))]
            return ParseResult(calls=[], text=text.strip(), errors=errors)
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        repaired = False
        block_end = text.find(self.calls_end, start)
        body_end = len(text) if block_end == -1 else block_end
        after = "" if block_end == -1 else text[block_end + len(self.calls_end):]
        pos = start + len(self.calls_begin)
        while True:
            pos = _skip_space(text, pos)
            if pos >= body_end:
                break
            if not text.startswith(self.call_begin, pos):
                errors.append(ParseError("stray_text", "text between calls of a "
                                         f"{self.calls_begin} block", (pos, body_end)))
                break
            head = pos + len(self.call_begin)
            close = text.find(self.call_end, head, body_end)
            nxt = text.find(self.call_begin, head, body_end)
            if close == -1 or (nxt != -1 and nxt < close):
                end = body_end if nxt == -1 else nxt
                errors.append(ParseError("unclosed_tag", f"{self.call_begin} is never closed",
                                         (pos, end)))
                pos = end
                continue
            span = (pos, close + len(self.call_end))
            call, fixed, error = self._one(text[head:close], head, span)
            repaired |= fixed
            if error is not None:
                errors.append(error)
            else:
                calls.append(call)
            pos = span[1]
        if not calls and not errors:
            errors.append(ParseError("empty_call", f"an empty {self.calls_begin} block",
                                     (start, body_end)))
        free = text[:start] + after
        return ParseResult(calls=calls, text=free.strip(), errors=errors, repaired=repaired)

    def _one(self, body: str, offset: int, span: tuple[int, int]
             ) -> tuple[ToolCall | None, bool, ParseError | None]:
        """One call's ``TYPE<｜tool▁sep｜>NAME\\n```json\\nARGS\\n``` ``."""
        at = body.find(self.sep)
        if at == -1:
            return None, False, ParseError("missing_name", f"a call without {self.sep}", span)
        line = body.find("\n", at)
        name = body[at + len(self.sep): len(body) if line == -1 else line].strip()
        args = "" if line == -1 else body[line + 1:]
        stripped = args.strip()
        if stripped.startswith("```"):
            newline = stripped.find("\n")
            stripped = "" if newline == -1 else stripped[newline + 1:]
            if stripped.rstrip().endswith("```"):
                stripped = stripped.rstrip()[:-3]
        if not stripped.strip():
            value: Any = {}
            fixed = False
        else:
            value, fixed, error = self._decode(stripped, offset + line + 1)
            if error is not None:
                return None, False, error
        call, error = self._call_from({"name": name, "arguments": value}, span)
        return call, fixed, error

    def render(self, calls: list[ToolCall], text: str = "") -> str:
        if not calls:
            return text
        markers = (self.calls_begin, self.calls_end, self.call_begin, self.call_end, self.sep)
        parts = []
        for c in calls:
            args = _dumps(c.arguments)
            if any(m in args for m in markers):  # a marker inside a JSON string
                args = args.replace("<", "\\u003c")  # still the same JSON, no marker in the text
            parts.append(f"{self.call_begin}function{self.sep}{c.name}\n```json\n{args}\n```"
                         f"{self.call_end}")
        body = "\n".join(parts)
        return f"{text}{self.calls_begin}{body}{self.calls_end}"


def get_format(name: str, **kwargs: Any) -> ToolCallFormat:
    """An instance of the tool-call format registered as ``name`` (e.g. ``"hermes"``)."""
    if isinstance(name, ToolCallFormat):
        return name
    return FORMATS.get(name)(**kwargs)
