"""Salesforce xLAM / APIGen (``xlam-function-calling-60k``): ``id``, ``query`` (the user's
request), ``tools`` and ``answers`` (JSON strings).

A tool is ``{"name", "description", "parameters": {param: {"type", "description",
"default"}}}`` with Python-style type strings (``str``, ``int``, ``List[str]``,
``str, optional``); an answer is ``[{"name", "arguments"}]``. Types map to JSON Schema
(a union, e.g. ``Union[int, str]``, leaves the parameter untyped; a word that names no type,
e.g. ``strnig``, is an error); a parameter is
required unless its type says ``optional``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from toolrl.core.bfcl import as_tool_call
from toolrl.data.records import decode_json, function_row, require

_SCALARS = {"str": "string", "string": "string", "int": "integer", "integer": "integer",
            "float": "number", "number": "number", "double": "number", "bool": "boolean",
            "boolean": "boolean"}
_ARRAYS = ("list", "tuple", "set", "array", "sequence")
_OBJECTS = ("dict", "object", "mapping")
_UNTYPED = re.compile(r"^\s*(|any|union\[.*\]|optional\[.*\]|literal\[.*\]|callable.*|"
                      r"none|null|\w+\s*\|.*)\s*(,\s*optional)?\s*$", re.IGNORECASE)
"""Type strings that name no single JSON type (the parameter is left untyped): ``Any``,
``Union[...]``, ``Optional[...]``, ``Literal[...]``, ``Callable``, ``a | b``; any other word
(``strnig``) is an unknown type, an error."""


def json_type(type_string: str) -> dict[str, Any]:
    """JSON Schema type of an xLAM type string (``{}`` when it names no JSON type)."""
    base = type_string.split(",")[0].strip()
    lower = base.lower()
    if lower in _SCALARS:
        return {"type": _SCALARS[lower]}
    outer, _, inner = lower.partition("[")
    if outer in _ARRAYS:
        item = json_type(inner.rstrip("]")) if inner else {}
        return {"type": "array", **({"items": item} if item else {})}
    if outer in _OBJECTS:
        return {"type": "object"}
    return {}


def xlam_tool(tool: Any, index: int = 0) -> dict[str, Any]:
    """An OpenAI function schema from an xLAM tool (the ``index``-th of its record)."""
    if not isinstance(tool, Mapping):
        raise ValueError(f"tool {index} is {type(tool).__name__}, not an object")
    if tool.get("type") == "function" and isinstance(tool.get("function"), Mapping):
        raise ValueError(f"tool {index} is in OpenAI's format ({{'type': 'function', "
                         f"'function': ...}}), not xLAM's ({{'name', 'description', "
                         f"'parameters'}}): convert such rows with --from toolrl")
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise ValueError(f"tool {index} has no 'name' (fields: "
                         f"{', '.join(map(repr, tool)) or 'none'})")
    params = tool.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"tool {tool.get('name')!r}: parameters must be an object")
    properties, required = {}, []
    for name, spec in params.items():
        if not isinstance(spec, Mapping):
            raise ValueError(f"tool {tool.get('name')!r}: parameter {name!r} is not an object")
        type_string = str(spec.get("type", ""))
        prop = json_type(type_string)
        if not prop and not _UNTYPED.match(type_string):
            raise ValueError(f"tool {tool['name']!r}: parameter {name!r} has an unknown type "
                             f"{type_string!r}")
        if spec.get("description"):
            prop["description"] = spec["description"]
        if "default" in spec and spec["default"] not in (None, ""):
            prop["default"] = spec["default"]
        properties[name] = prop
        if not re.search(r"\boptional\b", type_string, re.IGNORECASE):
            required.append(name)
    return {"name": tool["name"], "description": tool.get("description", ""),
            "parameters": {"type": "object", "properties": properties, "required": required}}


def convert_record(record: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """The FunctionCalling row of one xLAM record."""
    require(record, "xlam", "query", "tools", "answers")
    query = record["query"]
    if not isinstance(query, str) or not query.strip():
        raise ValueError("'query' is empty")
    tools = decode_json(record["tools"], "'tools'")
    answers = decode_json(record["answers"], "'answers'")
    if not isinstance(tools, list) or not isinstance(answers, list):
        raise ValueError("'tools' and 'answers' must be JSON lists")
    calls = [as_tool_call(a) for a in answers]
    row_id = f"xlam-{record.get('id', index)}"
    return [function_row("xlam", row_id, [{"role": "user", "content": query}],
                         [xlam_tool(t, i) for i, t in enumerate(tools)], calls)]
