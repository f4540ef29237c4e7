"""The Berkeley Function Calling Leaderboard (BFCL) AST checker: one implementation shared by the
`bfcl_ast` training reward, the FunctionCalling env, `toolrl score-calls` and evaluation.

A port of BFCL's own checker (``bfcl_eval/eval_checker/ast_eval/ast_checker.py``, Python
language), error types included. Ground truth uses BFCL's *possible-answer* format: a list of
expected calls, each a one-key dict ``{function_name: {param: [acceptable values]}}``; ``""``
among a parameter's acceptable values means it may be omitted.

What BFCL checks, and so does this module:

- the function name matches: under ``simple`` the name is the (first) offered function's, as
  BFCL's ``simple_function_checker`` takes it from the function description, not from the
  possible answer; a call to a function the row does not offer fails with that reason
  (``toolrl:function_not_offered``) unless the category is ``relevance``; the schema's
  ``required`` parameters are present; every parameter given is in the schema *and* in the
  possible answer; a parameter left out must list ``""``;
- types come from the tool's schema (BFCL's ``string integer float boolean array tuple dict
  any``). An int is accepted where a ``float`` is expected (and compared as a float), never the
  reverse; bools are never ints. Arrays check their items' type one level deep;
- **variables**: when the acceptable values are of another type than the schema's (a variable
  name ``"x"`` for an integer, ``true`` for a string, ``null`` for anything), a value of the
  answers' type is accepted and compared as is (Python ``in``), without normalization. So a
  listed ``null`` accepts ``null``, and ``"true"`` does not match a listed ``true``;
- strings are compared after removing spaces and ``, . / - _ * ^``, lower-casing and reading
  ``'`` as ``"``; lists element by element with strings so normalized, in order; dicts key by
  key against ``{key: [acceptable values]}`` (values normalized when strings, else compared by
  equality); lists of dicts dict by dict;
- ``simple``/``multiple``: exactly one call; ``parallel``/``parallel_multiple``: as many calls as
  expected, in any order; ``irrelevance``: no call (output that does not decode is no call);
  ``relevance`` (BFCL's ``live_relevance``): at least one well-formed call, whatever it is.

Intended differences (BFCL's data never exercises the last three):

- parallel calls are matched to the expected calls by a full bipartite matching; BFCL takes,
  for each expected call in order, the first unused call that passes (greedy), so it can fail
  an assignment that exists;
- JSON Schema names (``number object null``, unions like ``["string", "null"]``) are read as
  BFCL's types; a parameter whose schema has no known type is typed by its answers; a schema
  without ``required``/``properties`` is checked without them, and an expected call whose
  function is not offered fails every output (BFCL would raise); a row without tools is
  checked against its possible answers alone;
- a dict nested inside a dict parameter also matches an alternative written in possible-answer
  form (BFCL compares nested values by equality only).

Java and JavaScript (``simple_java``, ``simple_javascript``): every argument is a string of
source code, converted by BFCL's own type converter before the checks above, with the Python
type BFCL maps the language type to (`toolrl.core.bfcl_languages`); the tools passed to the
checker are BFCL's own, with the language's types. BFCL categories toolrl's checker does not
score (multi-turn: `toolrl.core.bfcl_multi_turn`; agentic) are a clear error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolrl.core import bfcl_languages as lang
from toolrl.core.bfcl_languages import language_of, presented_tools  # noqa: F401 (public)
from toolrl.core.types import ParseResult, ToolCall, as_tool_call

# --- categories ------------------------------------------------------------------------------
CATEGORIES = ("simple", "multiple", "parallel", "parallel_multiple", "irrelevance")
"""toolrl's own row categories (synthetic and converted rows)."""

BFCL_CATEGORIES = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
                   "parallel_multiple", "irrelevance", "live_simple", "live_multiple",
                   "live_parallel", "live_parallel_multiple", "live_irrelevance",
                   "live_relevance")
"""BFCL v4's single-turn categories: the ones toolrl's checker scores (Java and JavaScript
through BFCL's own type converters, `toolrl.core.bfcl_languages`)."""

SCORABLE = tuple(dict.fromkeys((*CATEGORIES, "relevance", *BFCL_CATEGORIES)))

_MULTI = ("multi-turn entries are episodes of toolrl/BFCLMultiTurn-v0 on BFCL's backends "
          "(toolrl data convert --from bfcl writes such rows)")
_EXEC = "executable categories call real APIs"
BFCL_UNSCORABLE: dict[str, str] = {  # BFCL's other category names, and why toolrl skips them
    **dict.fromkeys(("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                     "multi_turn_long_context", "multi_turn_composite"), _MULTI),
    **dict.fromkeys(("memory_kv", "memory_vector", "memory_rec_sum"),
                    "agentic memory entries are scored by BFCL's memory backends"),
    **dict.fromkeys(("web_search_base", "web_search_no_snippet"),
                    "agentic web-search entries are scored on the answer of a live search"),
    "format_sensitivity": "it is not a scoring category",
    **dict.fromkeys(("exec_simple", "exec_multiple", "exec_parallel", "exec_parallel_multiple",
                     "rest"), _EXEC),
    **dict.fromkeys(("sql", "chatable"), "it is an unused BFCL category"),
}


def check_mode(category: str | None, num_expected: int | None = None) -> str:
    """How a category is checked: ``simple``, ``multiple``, ``parallel``, ``irrelevance`` or
    ``relevance`` (BFCL's dispatch on the category name). ``None`` infers it from the number of
    expected calls. Raises ValueError for a category toolrl cannot score, saying why."""
    if category is None:
        if num_expected is None:
            raise ValueError("check_mode: give a category or the number of expected calls")
        return "irrelevance" if num_expected == 0 else "simple" if num_expected == 1 \
            else "parallel"
    if category not in SCORABLE:
        if category in BFCL_UNSCORABLE:
            raise ValueError(f"toolrl cannot score BFCL category {category!r}: "
                             f"{BFCL_UNSCORABLE[category]}; it scores "
                             f"{', '.join(BFCL_CATEGORIES)}")
        raise ValueError(f"unknown BFCL category {category!r}; valid: {', '.join(SCORABLE)}")
    if "relevance" in category:
        return "irrelevance" if "irrelevance" in category else "relevance"
    if "parallel" in category:
        return "parallel"
    return "multiple" if "multiple" in category else "simple"


def category_of(num_calls: int, num_tools: int) -> str:
    """The toolrl category of a row by the calls it expects and the tools it offers (BFCL's
    definitions: one tool or several, one call or several)."""
    if num_calls == 0:
        return "irrelevance"
    if num_calls == 1:
        return "simple" if num_tools <= 1 else "multiple"
    return "parallel" if num_tools <= 1 else "parallel_multiple"


# --- results ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckResult:
    """The verdict: ``valid``, and when not, BFCL's message and error type (e.g.
    ``type_error:simple``, ``simple_function_checker:missing_required``)."""

    valid: bool
    error: str = ""
    error_type: str = ""

    def __bool__(self) -> bool:
        return self.valid


_OK = CheckResult(True)

# Characters BFCL removes before comparing strings (plus the space).
_STRIP = re.compile(r"[ ,./\-_*^]")


def normalize_string(text: str) -> str:
    """BFCL's ``standardize_string``: drop spaces and ``, . / - _ * ^``; lower-case; ' -> \"."""
    return _STRIP.sub("", text).lower().replace("'", '"')


# --- inputs ----------------------------------------------------------------------------------
def tool_schemas(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Map tool name -> its parameters schema, from OpenAI-format tools (or bare functions)."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ValueError(f"not an OpenAI tool schema (no function name): {tool!r}")
        params = fn.get("parameters") or {}
        if not isinstance(params, Mapping):
            raise ValueError(f"tool {fn['name']!r}: 'parameters' must be an object")
        out[fn["name"]] = dict(params)
    return out


def parse_ground_truth(ground_truth: Sequence[Any]) -> list[tuple[str, dict[str, list[Any]]]]:
    """Validate BFCL possible answers; return ``[(function_name, {param: [acceptable]})]``."""
    if isinstance(ground_truth, (str, bytes)) or not isinstance(ground_truth, Sequence):
        raise ValueError(f"ground_truth must be a list of calls, got {type(ground_truth).__name__}")
    out = []
    for i, entry in enumerate(ground_truth):
        if not isinstance(entry, Mapping) or len(entry) != 1:
            raise ValueError(
                f"ground_truth[{i}] must be a one-key object {{function_name: {{param: "
                f"[acceptable values]}}}}, got {entry!r}"
            )
        (name, params), = entry.items()
        if not isinstance(params, Mapping):
            raise ValueError(f"ground_truth[{i}] ({name}): parameters must be an object")
        out.append((name, {p: _alternatives(v) for p, v in params.items()}))
    return out


def _alternatives(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _is_omit(value: Any) -> bool:
    return isinstance(value, str) and value == ""


# --- types -----------------------------------------------------------------------------------
_PYTHON_TYPES: dict[str, type] = {
    # BFCL's PYTHON_TYPE_MAPPING
    "string": str, "integer": int, "float": float, "boolean": bool, "array": list,
    "tuple": list, "dict": dict, "any": str,
    # JSON Schema names (OpenAI tools) and short aliases
    "number": float, "object": dict, "null": type(None),
    "str": str, "int": int, "double": float, "bool": bool, "list": list,
}
_NESTED = ("array", "tuple", "list")  # BFCL checks the item type of these


@dataclass(frozen=True)
class _Type:
    name: str  # as the schema spells it (for messages)
    py: type
    nested: type | None = None  # item type of an array


def _declared_type(schema: Any, value: Any) -> _Type | None:
    """The schema's type of a parameter; for a union, the member of the value's own type."""
    if not isinstance(schema, Mapping):
        return None
    raw = schema.get("type")
    names = [n for n in (raw if isinstance(raw, list) else [raw])
             if isinstance(n, str) and n in _PYTHON_TYPES]
    if not names:
        return None
    vt = float if type(value) is int else type(value)
    name = next((n for n in names if _PYTHON_TYPES[n] in (type(value), vt)), names[0])
    nested = None
    if name in _NESTED:
        items = schema.get("items")
        item_type = items.get("type") if isinstance(items, Mapping) else None
        nested = _PYTHON_TYPES.get(item_type) if isinstance(item_type, str) else None
    return _Type(name, _PYTHON_TYPES[name], nested)


def _answer_type(acceptable: Sequence[Any]) -> type | None:
    """BFCL's ``get_possible_answer_type``: the type of the first value that is not ``""``."""
    return next((type(a) for a in acceptable if not _is_omit(a)), None)


def _type_check(param: str, value: Any, acceptable: Sequence[Any],
                t: _Type) -> tuple[CheckResult, bool]:
    """BFCL's ``type_checker``: ``(verdict, is_variable)``."""
    answer_type = _answer_type(acceptable)
    is_variable = answer_type is not None and answer_type is not t.py
    if type(value) is t.py:
        if t.nested is None:
            return _OK, is_variable
        item = _Type(t.nested.__name__, t.nested)
        for alternative in acceptable:
            if type(alternative) is list and not all(
                    _type_check(param, v, alternative, item)[0].valid for v in value):
                continue
            return _OK, is_variable
        return CheckResult(False, f"Nested type checking failed for parameter {param!r}. "
                                  f"Expected outer type {t.name} with inner type "
                                  f"{t.nested.__name__}. Parameter value: {value!r}.",
                           "type_error:nested"), is_variable
    if answer_type is not None and type(value) is answer_type:
        return _OK, True
    return CheckResult(False, f"Incorrect type for parameter {param!r}. Expected type {t.name}, "
                              f"got {type(value).__name__}. Parameter value: {value!r}.",
                       "type_error:simple"), is_variable


# --- values ----------------------------------------------------------------------------------
def match_value(value: Any, acceptable: Sequence[Any], schema: Mapping[str, Any] | None = None,
                path: str = "value") -> str:
    """Return "" when ``value`` matches one of ``acceptable`` under ``schema``, else why."""
    return check_param(path, value, _alternatives(acceptable), schema).error


def check_param(param: str, value: Any, acceptable: Sequence[Any],
                schema: Mapping[str, Any] | None, language: str | None = None) -> CheckResult:
    """One parameter of a call, as BFCL's ``simple_function_checker`` checks it (``language``:
    ``java`` or ``javascript``, whose values BFCL converts from source code first)."""
    if language is not None:
        converted = _convert(param, value, schema, language)
        if isinstance(converted, CheckResult):
            return converted
        return _check_typed(param, *converted, acceptable)
    t = _declared_type(schema, value)
    if t is None:  # no known schema type: the answers' type (BFCL always has one)
        answer_type = _answer_type(acceptable)
        if answer_type is None:
            return _OK if value in acceptable else _value_error(param, value, acceptable)
        t = _Type(answer_type.__name__, answer_type)
    if t.py is float and type(value) is int:  # Python's int -> float, as BFCL allows
        value = float(value)
    return _check_typed(param, value, t, acceptable)


def _convert(param: str, value: Any, schema: Mapping[str, Any] | None,
             language: str) -> tuple[Any, _Type] | CheckResult:
    """BFCL's conversion of a Java/JavaScript argument: (the value, its expected type), or the
    type error of a value that is not a string."""
    if type(value) is not str:
        return CheckResult(False, f"Incorrect type for parameter {param!r}. Expected type "
                                  f"String, got {type(value).__name__}. Parameter value: "
                                  f"{value!r}.",
                           "type_error:java" if language == "java" else "type_error:js")
    type_name = (schema or {}).get("type")
    if not isinstance(type_name, str):
        raise ValueError(f"parameter {param!r} has no {language} type in the row's tools "
                         f"(BFCL's own function docs are needed to check {language})")
    nested = nested_py = None
    if type_name in lang.NESTED:
        nested = ((schema or {}).get("items") or {}).get("type")
        nested_py = lang.python_type(language, nested)
    py = lang.python_type(language, type_name)
    try:
        value = lang.convert(language, value, type_name, nested)
    except NotImplementedError as exc:  # BFCL's converter leaves Set, Queue, ... unwritten
        raise ValueError(f"parameter {param!r}: BFCL cannot convert {language} type "
                         f"{type_name!r} ({exc})") from None
    if type_name == "tuple" and type(value) is tuple:
        value = list(value)
    return value, _Type(type_name, py, nested_py)


def _check_typed(param: str, value: Any, t: _Type, acceptable: Sequence[Any]) -> CheckResult:
    verdict, is_variable = _type_check(param, value, acceptable, t)
    if not verdict.valid:
        return verdict
    if not is_variable:  # a variable is compared as is, below
        if t.py is dict:
            return _dict_checker(param, value, acceptable)
        if t.py is list and t.nested is dict:
            return _list_dict_checker(param, value, acceptable)
        if t.py is str:
            return _string_checker(param, value, acceptable)
        if t.py is list:
            return _list_checker(param, value, acceptable)
    return _OK if value in acceptable else _value_error(param, value, acceptable)


def _value_error(param: str, value: Any, acceptable: Sequence[Any]) -> CheckResult:
    return CheckResult(False, f"Invalid value for parameter {param!r}: {value!r}. Expected one "
                              f"of {list(acceptable)!r}.", "value_error:others")


def _std(value: Any) -> Any:
    return normalize_string(value) if type(value) is str else value


def _string_checker(param: str, value: str, acceptable: Sequence[Any]) -> CheckResult:
    if normalize_string(value) in [normalize_string(a) for a in acceptable if type(a) is str]:
        return _OK
    return CheckResult(False, f"Invalid value for parameter {param!r}: {value!r}. Expected one "
                              f"of {list(acceptable)!r}. Case insensitive.", "value_error:string")


def _list_checker(param: str, value: list[Any], acceptable: Sequence[Any]) -> CheckResult:
    # BFCL iterates each alternative, so "" (the omit marker) reads as the empty list
    alternatives = [[_std(x) for x in a] for a in acceptable if isinstance(a, (list, str))]
    if [_std(x) for x in value] in alternatives:
        return _OK
    return CheckResult(False, f"Invalid value for parameter {param!r}: {value!r}. Expected one "
                              f"of {list(acceptable)!r}.", "value_error:list/tuple")


def _dict_checker(param: str, value: Any, acceptable: Sequence[Any]) -> CheckResult:
    """BFCL's ``dict_checker``: ``value`` against dicts of ``{key: [acceptable values]}``."""
    if not isinstance(value, Mapping):
        return CheckResult(False, f"Incorrect type for parameter {param!r}. Expected type dict, "
                                  f"got {type(value).__name__}. Parameter value: {value!r}.",
                           "type_error:simple")
    result = CheckResult(False, f"Parameter {param!r}: no dict among the acceptable values "
                                f"{list(acceptable)!r}.", "dict_checker:unclear")
    for alternative in acceptable:
        if _is_omit(alternative) or not isinstance(alternative, Mapping):
            continue
        result = _dict_against(value, alternative)
        if result.valid:
            return _OK
    return result


def _dict_against(value: Mapping[str, Any], expected: Mapping[str, Any],
                  nested: bool = False) -> CheckResult:
    """``value`` against one possible-answer dict: BFCL's ``dict_checker`` at the top level
    (``nested``: toolrl's reading of a dict inside it, whose bare values are its only answer)."""
    for key, v in value.items():
        if key not in expected:
            return CheckResult(False, f"Unexpected dict key parameter: {key!r}.",
                               "value_error:dict_key")
        alternatives = _alternatives(expected[key]) if nested else \
            _dict_alternatives(expected[key])
        if _std(v) in [_std(a) for a in alternatives]:
            continue
        if isinstance(v, Mapping) and any(  # a nested dict in possible-answer form
                isinstance(a, Mapping) and _dict_against(v, a, nested=True).valid
                for a in alternatives):
            continue
        return CheckResult(False, f"Invalid value for parameter {key!r}: {v!r}. Expected one "
                                  f"of {[_std(a) for a in alternatives]!r}.",
                           "value_error:dict_value")
    for key, alternatives in expected.items():
        optional = any(_is_omit(a) for a in _alternatives(alternatives)) \
            if nested or not isinstance(alternatives, (list, tuple, str)) \
            else "" in alternatives  # BFCL's test: a substring test on a bare string
        if key not in value and not optional:
            return CheckResult(False, f"Missing dict key parameter: {key!r}.",
                               "value_error:dict_key")
    return _OK


def _dict_alternatives(expected: Any) -> list[Any]:
    """A dict key's acceptable values as BFCL's ``dict_checker`` iterates them: a string that
    is not in a list (a slip in BFCL's data) is iterated character by character."""
    return list(expected) if isinstance(expected, (list, tuple, str)) else [expected]


def _list_dict_checker(param: str, value: list[Any], acceptable: Sequence[Any]) -> CheckResult:
    """BFCL's ``list_dict_checker``: dict by dict, in order, against each alternative."""
    result = CheckResult(False, f"Parameter {param!r}: no list of dicts among the acceptable "
                                f"values.", "list_dict_checker:unclear")
    for alternative in acceptable:
        if not isinstance(alternative, (list, str)):
            continue
        if len(value) != len(alternative):
            result = CheckResult(False, "Wrong number of dictionaries in the list.",
                                 "value_error:list_dict_count")
            continue
        for item, expected in zip(value, alternative, strict=True):
            result = _dict_checker(param, item, [expected])
            if not result.valid:
                break
        else:
            return _OK
    return result


# --- calls -----------------------------------------------------------------------------------
def check_call(call: ToolCall | Mapping[str, Any], name: str, expected: Mapping[str, list[Any]],
               schema: Mapping[str, Any] | None = None,
               language: str | None = None) -> CheckResult:
    """One call against one expected call (BFCL's ``simple_function_checker``).

    ``schema`` is the tool's parameters schema; None when the tool is not among the schemas,
    in which case types come from the acceptable values and nothing is required. ``language``:
    ``java`` / ``javascript`` (arguments are source code, converted as BFCL converts them).
    """
    call = as_tool_call(call)
    if call.name != name:
        return CheckResult(False, f"Function name {name!r} not found in model output.",
                           "simple_function_checker:wrong_func_name")
    args = call.arguments
    if not isinstance(args, Mapping):
        return CheckResult(False, f"{name}: arguments must be an object, got {args!r}",
                           "ast_decoder:decoder_wrong_output_format")
    props = (schema or {}).get("properties") or {}
    for param in (schema or {}).get("required") or []:
        if param not in args:
            return CheckResult(False, f"{name}: Missing required parameter: {param!r}.",
                               "simple_function_checker:missing_required")
    for param, value in args.items():
        if (schema is not None and param not in props) or param not in expected:
            return CheckResult(False, f"{name}: Unexpected parameter: {param!r}.",
                               "simple_function_checker:unexpected_param")
        verdict = check_param(param, value, expected[param], props.get(param), language)
        if not verdict.valid:
            return CheckResult(False, f"{name}: {verdict.error}", verdict.error_type)
    for param, acceptable in expected.items():
        if param not in args and not any(_is_omit(a) for a in acceptable):
            return CheckResult(False, f"{name}: Optional parameter {param!r} not provided and "
                                      f"not marked as optional.",
                               "simple_function_checker:missing_optional")
    return _OK


def check_calls(calls: Sequence[ToolCall | Mapping[str, Any]], ground_truth: Sequence[Any],
                category: str | None = None,
                tools: Sequence[Mapping[str, Any]] | None = None) -> CheckResult:
    """Check decoded calls against BFCL possible answers for a category (see the module
    docstring). ``category`` None infers it from the ground truth (none: irrelevance, one:
    simple, more: parallel). Raises ValueError on malformed ground truth, tools or category."""
    expected = parse_ground_truth(ground_truth)
    mode = check_mode(category, len(expected))
    schemas = tool_schemas(tools)
    language = language_of(category)
    if language is not None and not schemas:
        raise ValueError(f"category {category!r} needs the row's tools (BFCL's own function "
                         f"docs, with their {language} types)")
    calls = [as_tool_call(c) for c in calls]
    if mode == "irrelevance":
        if calls:
            return CheckResult(False, "Valid syntax. Successfully decode AST when it should not. "
                                      f"({len(calls)} call(s): "
                                      f"{', '.join(c.name for c in calls)})",
                               "irrelevance_error:decoder_success")
        return _OK
    if mode == "relevance":
        return _OK if calls else CheckResult(
            False, "Invalid syntax. Failed to decode AST when it should have. (no call)",
            "relevance_error:decoder_failed")
    if mode in ("simple", "multiple") and len(expected) != 1:
        raise ValueError(f"category {category!r} needs exactly one ground-truth call, "
                         f"got {len(expected)}")
    if len(calls) != len(expected):
        checker = {"simple": "simple_function_checker", "multiple": "multiple_function_checker"
                   }.get(mode, "parallel_function_checker_no_order")
        return CheckResult(False, f"Wrong number of functions: expected {len(expected)}, got "
                                  f"{len(calls)}.", f"{checker}:wrong_count")
    if schemas:
        stray = next((c for c in calls if c.name not in schemas), None)
        if stray is not None:
            return CheckResult(False, f"Function {stray.name!r} is not among the functions "
                                      f"offered ({', '.join(schemas)}).",
                               "toolrl:function_not_offered")
        if mode == "simple":  # BFCL: the name is the offered function's (func_description[0])
            name = next(iter(schemas))
            return check_call(calls[0], name, expected[0][1], schemas[name], language)
        missing = next((n for n, _ in expected if n not in schemas), None)
        if missing is not None:  # BFCL's find_description finds nothing (and it raises)
            return CheckResult(False, f"The possible answer calls {missing!r}, which is not "
                                      f"among the functions offered ({', '.join(schemas)}).",
                               "toolrl:function_not_offered")
    if mode != "parallel":
        name, params = expected[0]
        return check_call(calls[0], name, params, schemas.get(name))
    return _match_all(calls, expected, schemas)


def check_parsed(parses: Sequence[ParseResult], ground_truth: Sequence[Any],
                 category: str | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
                 *, strict_parse: bool = True) -> CheckResult:
    """`check_calls` on the calls of some parsed assistant turns.

    With ``strict_parse`` the output decodes all or nothing, as in BFCL: a malformed tool call
    fails an AST or relevance check and, under irrelevance, makes the output no call (a pass).
    Without it, malformed calls are ignored and the well-formed ones are judged.
    """
    mode = check_mode(category, len(ground_truth or []))
    errors = [e for p in parses for e in p.errors]
    if strict_parse and errors:
        if mode == "irrelevance":
            return _OK
        kind = "relevance_error:decoder_failed" if mode == "relevance" \
            else "ast_decoder:decoder_failed"
        return CheckResult(False, f"Invalid syntax. Failed to decode AST. ({errors[0].kind}: "
                                  f"{errors[0].message})", kind)
    return check_calls([c for p in parses for c in p.calls], ground_truth, category, tools)


def _match_all(calls: list[ToolCall], expected: list[tuple[str, dict[str, list[Any]]]],
               schemas: Mapping[str, dict[str, Any]]) -> CheckResult:
    """Any-order matching: a perfect bipartite matching of expected calls to model calls."""
    verdicts = [[check_call(c, name, params, schemas.get(name)) for c in calls]
                for name, params in expected]
    owner: dict[int, int] = {}  # call index -> expected index

    def augment(i: int, seen: set[int]) -> bool:
        for j, verdict in enumerate(verdicts[i]):
            if verdict.valid and j not in seen:
                seen.add(j)
                if j not in owner or augment(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    for i in range(len(expected)):
        if not augment(i, set()):
            name = expected[i][0]
            same = [v for j, v in enumerate(verdicts[i]) if calls[j].name == name]
            why = same[0].error if same else f"no call to {name!r}"
            return CheckResult(False, f"Could not find a matching function for index {i} of "
                                      f"possible answers ({name}): {why}",
                               "parallel_function_checker_no_order:cannot_find_match")
    return _OK


# --- ground truth <-> calls ------------------------------------------------------------------
def ground_truth_calls(ground_truth: Sequence[Any],
                       tools: Sequence[Mapping[str, Any]] | None = None,
                       category: str | None = None) -> list[ToolCall]:
    """Calls that pass the check: per parameter the first acceptable value, dicts (and lists of
    dicts) taken out of possible-answer form; a parameter that may be omitted is omitted unless
    the schema requires it. Java and JavaScript categories: each value as source code
    (`toolrl.core.bfcl_languages.source`)."""
    language = lang.language_of(category)
    schemas = tool_schemas(tools)
    calls = []
    for name, params in parse_ground_truth(ground_truth):
        schema = schemas.get(name) or {}
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        arguments = {}
        for param, acceptable in params.items():
            present = [a for a in acceptable if not _is_omit(a)]
            if not present or (len(present) < len(acceptable) and param not in required):
                continue
            arguments[param] = _concrete(present[0], props.get(param))
            if language is not None:
                spec = props.get(param) or {}
                nested = (spec.get("items") or {}).get("type") \
                    if spec.get("type") in lang.NESTED else None
                arguments[param] = lang.source(language, arguments[param],
                                               str(spec.get("type")), nested)
        calls.append(ToolCall(name, arguments))
    return calls


def _concrete(answer: Any, schema: Any) -> Any:
    t = _declared_type(schema, answer)
    if isinstance(answer, Mapping) and (t is None or t.py is dict):
        return _concrete_dict(answer)
    if isinstance(answer, list) and t is not None and t.py is list and t.nested is dict:
        return [_concrete_dict(x) if isinstance(x, Mapping) else x for x in answer]
    return answer


def _concrete_dict(answer: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, alternatives in answer.items():
        alternatives = _alternatives(alternatives)
        present = [a for a in alternatives if not _is_omit(a)]
        if present and len(present) == len(alternatives):
            out[key] = present[0]
    return out


def possible_answer(call: ToolCall | Mapping[str, Any],
                    schema: Mapping[str, Any] | None = None) -> dict[str, dict[str, list[Any]]]:
    """The possible answer a concrete call stands for: each argument its only acceptable value,
    dict arguments (and lists of dicts) in possible-answer form where the checker reads them."""
    call = as_tool_call(call)
    props = (schema or {}).get("properties") or {}
    return {call.name: {param: [_answer_value(value, props.get(param))]
                        for param, value in call.arguments.items()}}


def _answer_value(value: Any, schema: Any) -> Any:
    t = _declared_type(schema, value)
    if isinstance(value, Mapping) and (t is None or t.py is dict):
        return {k: [v] for k, v in value.items()}
    if isinstance(value, list) and t is not None and t.py is list and t.nested is dict and \
            all(isinstance(x, Mapping) for x in value):
        return [{k: [v] for k, v in x.items()} for x in value]
    return value
