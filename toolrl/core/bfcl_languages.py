"""BFCL's Java and JavaScript categories (``simple_java``, ``simple_javascript``): how BFCL shows
their functions to a model, how it reads the model's arguments, and calls that stand for their
possible answers.

A Java or JavaScript function's parameters have that language's types (``String``, ``long``,
``HashMap``, ``ArrayList`` of ``String``; ``Boolean``, ``Bigint``, ``dict``...), and a model
passes every argument as a *string of source code* (``"new HashMap<String, String>() {{
put(\\"limit\\", \\"50\\"); }}"``, ``"5L"``, ``"[1, 2]"``). BFCL's checker converts each string
with its own type converter (``bfcl_eval``'s ``java_type_converter`` / ``js_type_converter``,
used here as a library) into a Python value of the language type's Python counterpart, then
checks it as it checks Python; a value that is not a string fails (``type_error:java`` /
``type_error:js``). `toolrl.core.bfcl.check_calls` does this for these categories.

- `presented_tools`: the functions as BFCL's dataset loader gives them to a model
  (``_func_doc_language_specific_pre_processing``): every parameter typed ``string``, its
  description saying which language type it stands for; the row keeps BFCL's own types, which
  the checker reads.
- `convert`: BFCL's converter for one argument; `python_type`: the Python type BFCL expects
  after conversion (its ``JAVA_TYPE_CONVERSION`` / ``JS_TYPE_CONVERSION``).
- `source`: a value as source code the converter reads back to that value (the oracle and the
  row check use it for the possible answers' calls).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

LANGUAGES = {"simple_java": "java", "simple_javascript": "javascript"}
"""BFCL categories whose arguments are source code of another language."""
HINTS = {"java": " Note that the provided function is in Java 8 SDK syntax.",
         "javascript": " Note that the provided function is in JavaScript syntax.",
         "python": " Note that the provided function is in Python 3 syntax."}
"""BFCL's language hint, appended to every function description."""
NESTED = ("Array", "ArrayList", "array")  # BFCL's NESTED_CONVERSION_TYPE_LIST
_NAME = {"java": "Java", "javascript": "JavaScript"}


def language_of(category: str | None) -> str | None:
    """``java`` / ``javascript`` for BFCL's Java and JavaScript categories, else None."""
    return LANGUAGES.get(category or "")


@cache
def _bfcl() -> dict[str, Any]:
    try:  # lazy: bfcl-eval is optional (installed apart, --no-deps)
        from bfcl_eval.constants.type_mappings import JAVA_TYPE_CONVERSION, JS_TYPE_CONVERSION
        from bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter import (
            java_type_converter,
        )
        from bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter import (
            js_type_converter,
        )
    except ImportError:
        raise ImportError("BFCL's Java and JavaScript type converters come from bfcl-eval, "
                          "which is not installed: pip install --no-deps "
                          "'bfcl-eval==2026.3.23' (make install does)") from None
    return {"java": (JAVA_TYPE_CONVERSION, java_type_converter),
            "javascript": (JS_TYPE_CONVERSION, js_type_converter)}


def python_type(language: str, type_name: str) -> type:
    """The Python type BFCL expects a converted argument of ``type_name`` to have. Raises
    ValueError for a type BFCL does not know in that language."""
    mapping = _bfcl()[language][0]
    if type_name not in mapping:
        raise ValueError(f"BFCL knows no {_NAME[language]} type {type_name!r}; its types: "
                         f"{', '.join(mapping)}")
    return mapping[type_name]


def convert(language: str, value: str, type_name: str, nested: str | None = None) -> Any:
    """BFCL's converter on one argument (``nested``: the item type of an array type)."""
    converter = _bfcl()[language][1]
    return converter(value, type_name, nested) if nested is not None else \
        converter(value, type_name)


# --- what the model sees ---------------------------------------------------------------------
def presented_tools(tools: Sequence[Mapping[str, Any]], language: str) -> list[dict[str, Any]]:
    """OpenAI tools as BFCL presents a language's functions: every parameter a ``string``, its
    description naming the language type (BFCL's ``_func_doc_language_specific_pre_processing``,
    without the hint, which the row's descriptions already end with)."""
    name = _NAME[language]
    out = []
    for tool in tools:
        tool = copy.deepcopy(dict(tool))
        function = tool.get("function", tool) if tool.get("type") == "function" else tool
        properties = (function.get("parameters") or {}).get("properties") or {}
        for spec in properties.values():
            kind = spec.get("type")
            spec["description"] = str(spec.get("description", ""))
            if kind == "any":
                spec["description"] += (f" This parameter can be of any type of {name} object "
                                        f"in string representation.")
            else:
                spec["description"] += (f" This is {name} {kind} type parameter in string "
                                        f"representation.")
            if kind in (("ArrayList", "Array") if language == "java" else ("array",)):
                items = (spec.get("items") or {}).get("type")
                spec["description"] += (f" The list elements are of type {items}; they are "
                                        f"not in string representation.")
                spec.pop("items", None)
            if language == "javascript" and kind == "dict" and "properties" in spec:
                spec["description"] += (f" The dictionary entries have the following schema; "
                                        f"they are not in string representation. "
                                        f"{json.dumps(spec['properties'])}")
                del spec["properties"]
            spec["type"] = "string"
        if function.get("parameters", {}).get("type") == "dict":
            function["parameters"]["type"] = "object"
        out.append(tool)
    return out


# --- values as source code -------------------------------------------------------------------
def source(language: str, value: Any, type_name: str, nested: str | None = None) -> str:
    """``value`` written in the language so that BFCL's converter reads it back (a string is
    taken as written: a variable name, or text)."""
    if isinstance(value, str):
        return value
    if language == "java":
        return _java(value, type_name, nested)
    return _js(value, type_name, nested)


def _java_scalar(value: Any, type_name: str | None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if type_name == "long" and isinstance(value, int):
        return f"{value}L"
    if type_name == "float" and isinstance(value, (int, float)):
        return f"{float(value)!r}f"
    if isinstance(value, float) and type_name in ("double", None):
        return repr(value)
    return str(value)


def _java_item(value: Any, nested: str | None) -> str:
    if nested in ("String", "char") or (nested is None and isinstance(value, str)):
        return f'"{value}"'
    return _java_scalar(value, nested)


def _java(value: Any, type_name: str, nested: str | None) -> str:
    if type_name == "ArrayList" and isinstance(value, list):
        if not value:
            return f"new ArrayList<{nested or 'Object'}>()"
        items = ", ".join(_java_item(v, nested) for v in value)
        return f"new ArrayList<>(Arrays.asList({items}))"
    if type_name == "Array" and isinstance(value, list):
        items = ", ".join(str(v) if isinstance(v, str) else _java_scalar(v, nested)
                          for v in value)
        return f"new {nested if nested and nested.isidentifier() else 'Object'}[]{{{items}}}"
    if type_name == "HashMap" and isinstance(value, Mapping):
        puts = " ".join(f'put("{k}", {_java_item(v, None)});' for k, v in value.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}" if puts else \
            "new HashMap<String, Object>()"
    return _java_scalar(value, type_name)


def _js_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_js_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_js_value(v)}" for k, v in value.items()) + "}"
    return repr(value) if isinstance(value, float) else str(value)


def _js(value: Any, type_name: str, nested: str | None) -> str:
    if type_name == "Bigint" and isinstance(value, int) and not isinstance(value, bool):
        return f"{value}n"
    return _js_value(value)
