"""The Berkeley Function Calling Leaderboard (BFCL) AST checker: one implementation shared by the
`bfcl_ast` training reward, `toolrl score-calls` and evaluation.

Ground truth uses BFCL's *possible-answer* format: a list of expected calls, each a one-key dict
``{function_name: {param: [acceptable values]}}``. ``""`` among a parameter's acceptable values
means the parameter may be omitted. Nested dicts use the same format one level down
(``{key: [acceptable values]}``); a non-list value ``v`` is read as ``[v]``.

Semantics (`check_calls`):

- the function name matches exactly; required parameters (the tool schema's ``required``) are
  present; no unknown parameters (not in the schema, or not in the possible answer);
- an optional parameter may be omitted only when its acceptable values include ``""``;
- types come from the tool's JSON schema (``string integer number boolean array object null``;
  BFCL's own ``float dict tuple`` are aliases); where the schema gives no type it is inferred
  from the acceptable values. An int is accepted where a number (float) is expected, never the
  reverse (``3.0`` is not an ``integer``); bools are never ints or numbers, and ints never bools;
- strings are compared after lower-casing and removing spaces and ``, . / - _ * ^`` (and, as
  BFCL does, with ``'`` read as ``"``);
- lists are order-sensitive and compared element by element with the same rules (the schema's
  ``items`` types them); dicts key by key, recursively;
- categories: ``simple`` and ``multiple`` expect exactly one call; ``parallel`` and
  ``parallel_multiple`` accept the calls in any order but exactly the expected count (a full
  bipartite matching, so no valid assignment is missed); ``irrelevance`` passes only when no call
  is made.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolrl.core.types import ParseError, ParseResult, ToolCall

CATEGORIES = ("simple", "multiple", "parallel", "parallel_multiple", "irrelevance")

# Characters BFCL removes before comparing strings (plus the space).
_STRIP = re.compile(r"[ ,./\-_*^]")

_TYPE_ALIASES = {
    "string": "string", "str": "string",
    "integer": "integer", "int": "integer",
    "number": "number", "float": "number", "double": "number",
    "boolean": "boolean", "bool": "boolean",
    "array": "array", "list": "array", "tuple": "array",
    "object": "object", "dict": "object",
    "null": "null",
}


@dataclass(frozen=True)
class CheckResult:
    """The verdict of the checker: ``valid``, and when not, a reason and a short error type."""

    valid: bool
    error: str = ""
    error_type: str = ""  # wrong_count, wrong_func_name, missing_required, unexpected_param,
    # missing_param, type_error, value_error, bad_arguments, no_match

    def __bool__(self) -> bool:
        return self.valid


_OK = CheckResult(True)


def normalize_string(text: str) -> str:
    """BFCL's standardization: drop spaces and ``, . / - _ * ^``; lower-case; ' becomes \"."""
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


def as_tool_call(obj: ToolCall | Mapping[str, Any]) -> ToolCall:
    """A ToolCall from a ToolCall, ``{"name", "arguments"}`` or OpenAI ``{"function": {...}}``.

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


# --- types -----------------------------------------------------------------------------------
def _schema_types(schema: Mapping[str, Any] | None) -> list[str] | None:
    if not isinstance(schema, Mapping) or "type" not in schema:
        return None
    raw = schema["type"]
    names = raw if isinstance(raw, list) else [raw]
    types = [_TYPE_ALIASES[n] for n in names if isinstance(n, str) and n in _TYPE_ALIASES]
    return types or None


def _value_type(value: Any) -> str | None:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    if value is None:
        return "null"
    return None


def _infer_types(acceptable: Sequence[Any]) -> list[str] | None:
    """BFCL's fallback: the type of the first acceptable value that is not the ``""`` marker."""
    for a in acceptable:
        if a != "" or not isinstance(a, str):
            t = _value_type(a)
            # An int in the answers of an untyped parameter reads as "number" (int or float).
            return ["number"] if t == "integer" else ([t] if t else None)
    return None


def _type_ok(value: Any, t: str) -> bool:
    vt = _value_type(value)
    if t == "number":
        return vt in ("integer", "number")
    return vt == t


# --- values ----------------------------------------------------------------------------------
def match_value(value: Any, acceptable: Sequence[Any], schema: Mapping[str, Any] | None = None,
                path: str = "value") -> str:
    """Return "" when ``value`` matches one of ``acceptable`` under ``schema``, else the reason."""
    mismatch = _match(value, acceptable, schema, path)
    return mismatch[1] if mismatch else ""


def _match(value: Any, acceptable: Sequence[Any], schema: Mapping[str, Any] | None,
           path: str) -> tuple[str, str] | None:
    """None on a match, else ``(error_type, reason)``."""
    types = _schema_types(schema) or _infer_types(acceptable)
    if types is None:  # nothing to type against: only the "" marker (omit) is acceptable
        if isinstance(value, str) and normalize_string(value) in {
                normalize_string(a) for a in acceptable if isinstance(a, str)}:
            return None
        return "value_error", f"{path}: unexpected value {value!r}; acceptable: {acceptable!r}"
    t = next((t for t in types if _type_ok(value, t)), None)
    if t is None:
        got = _value_type(value) or type(value).__name__
        return "type_error", f"{path}: expected type {'/'.join(types)}, got {got} ({value!r})"
    inner = _match_typed(value, acceptable, t, schema, path)
    if inner is None:
        return None
    if inner:  # one structured alternative: say where inside it the value differs
        return "value_error", inner
    shown = [a for a in acceptable if a != "" or not isinstance(a, str)]
    return "value_error", f"{path}: value {value!r} is not among the acceptable values {shown!r}"


def _match_typed(value: Any, acceptable: Sequence[Any], t: str,
                 schema: Mapping[str, Any] | None, path: str) -> str | None:
    """None on a match; else the inner reason when one list/dict alternative was tried, or ""."""
    if t == "string":
        norm = normalize_string(value)
        ok = any(isinstance(a, str) and normalize_string(a) == norm for a in acceptable)
    elif t in ("integer", "number"):
        ok = any(_value_type(a) in ("integer", "number") and a == value for a in acceptable)
    elif t == "boolean":
        ok = any(isinstance(a, bool) and a == value for a in acceptable)
    elif t == "null":
        ok = any(a is None for a in acceptable)
    else:
        reasons = [_match_compound(value, a, t, schema, path) for a in acceptable
                   if _value_type(a) == t]
        if any(r == "" for r in reasons):
            return None
        return reasons[0] if len(reasons) == 1 else ""
    return None if ok else ""


def _match_compound(value: Any, expected: Any, t: str, schema: Mapping[str, Any] | None,
                    path: str) -> str:
    """Match a list (order-sensitive) or a dict (key by key) against one alternative."""
    if t == "object":
        return match_dict(value, expected, schema, path)
    if len(value) != len(expected):
        return f"{path}: expected {len(expected)} item(s), got {len(value)} ({value!r})"
    items = schema.get("items") if isinstance(schema, Mapping) else None
    for i, (v, x) in enumerate(zip(value, expected, strict=True)):
        err = match_value(v, [x], items, f"{path}[{i}]")
        if err:
            return err
    return ""


def match_dict(value: Mapping[str, Any], expected: Mapping[str, Any],
               schema: Mapping[str, Any] | None = None, path: str = "value") -> str:
    """Key-by-key recursive match of a dict against ``{key: [acceptable values]}``."""
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    props = props if isinstance(props, Mapping) else {}
    for key, v in value.items():
        if key not in expected:
            return f"{path}: unexpected key {key!r}"
        err = match_value(v, _alternatives(expected[key]), props.get(key), f"{path}.{key}")
        if err:
            return err
    for key, acc in expected.items():
        if key not in value and "" not in _alternatives(acc):
            return f"{path}: missing key {key!r}"
    return ""


# --- calls -----------------------------------------------------------------------------------
def check_call(call: ToolCall | Mapping[str, Any], name: str, expected: Mapping[str, list[Any]],
               schema: Mapping[str, Any] | None = None) -> CheckResult:
    """Check one call against one expected call (BFCL's simple function checker).

    ``schema`` is the tool's parameters schema; None when the tool is not among the schemas, in
    which case types are inferred from the acceptable values and nothing is required.
    """
    call = as_tool_call(call)
    if call.name != name:
        return CheckResult(False, f"function name {call.name!r} does not match expected {name!r}",
                           "wrong_func_name")
    args = call.arguments
    if not isinstance(args, Mapping):
        return CheckResult(False, f"{name}: arguments must be an object, got {args!r}",
                           "bad_arguments")
    props = (schema or {}).get("properties") or {}
    for param in (schema or {}).get("required") or []:
        if param not in args:
            return CheckResult(False, f"{name}: missing required parameter {param!r}",
                               "missing_required")
    for param, value in args.items():
        if (schema is not None and param not in props) or param not in expected:
            return CheckResult(False, f"{name}: unexpected parameter {param!r}",
                               "unexpected_param")
        mismatch = _match(value, expected[param], props.get(param), f"{name}.{param}")
        if mismatch:
            return CheckResult(False, mismatch[1], mismatch[0])
    for param, acceptable in expected.items():
        if param not in args and "" not in acceptable:
            return CheckResult(False, f"{name}: parameter {param!r} omitted but not optional",
                               "missing_param")
    return _OK


def check_calls(calls: Sequence[ToolCall | Mapping[str, Any]], ground_truth: Sequence[Any],
                category: str | None = None,
                tools: Sequence[Mapping[str, Any]] | None = None) -> CheckResult:
    """Check the model's calls against BFCL possible answers for a category.

    ``category`` None infers it: no expected call -> irrelevance, one -> simple, more -> parallel.
    Raises ValueError on malformed ground truth, tools or category.
    """
    expected = parse_ground_truth(ground_truth)
    schemas = tool_schemas(tools)
    calls = [as_tool_call(c) for c in calls]
    if category is None:
        category = "irrelevance" if not expected else "simple" if len(expected) == 1 else "parallel"
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; valid: {', '.join(CATEGORIES)}")
    if category == "irrelevance":
        if calls:
            names = ", ".join(c.name for c in calls)
            return CheckResult(False, f"irrelevance: expected no call, got {len(calls)} ({names})",
                               "wrong_count")
        return _OK
    if category in ("simple", "multiple") and len(expected) != 1:
        raise ValueError(f"category {category!r} needs exactly one ground-truth call, "
                         f"got {len(expected)}")
    if len(calls) != len(expected):
        return CheckResult(False, f"{category}: expected {len(expected)} call(s), got {len(calls)}",
                           "wrong_count")
    if len(expected) == 1:
        name, params = expected[0]
        return check_call(calls[0], name, params, schemas.get(name))
    return _match_all(calls, expected, schemas)


def check_parsed(parses: Sequence[ParseResult], ground_truth: Sequence[Any],
                 category: str | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
                 *, strict_parse: bool = True) -> CheckResult:
    """`check_calls` on every call of some parsed assistant turns.

    With ``strict_parse`` a malformed tool call (a parse error) fails the check, except under
    ``irrelevance``, where (as in BFCL) output that does not decode to a call is no call.
    """
    if category is None and not ground_truth:
        category = "irrelevance"
    errors = [e for p in parses for e in p.errors]
    if strict_parse and errors and category != "irrelevance":
        return CheckResult(False, f"malformed tool call ({errors[0].kind}): {errors[0].message}",
                           "parse_error")
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
            return CheckResult(False, f"no call matches expected call #{i} ({name}): {why}",
                               "no_match")
    return _OK


# --- offline scoring (`toolrl score-calls`) ----------------------------------------------------
_SCORE_KEYS = ("id", "category", "tools", "ground_truth", "candidate")


@dataclass(frozen=True)
class CategoryStats:
    """Per-category outcome of `score_calls`."""

    n: int
    passed: int
    mean_score: float
    errors: int  # samples on which the reward raised (scored with the fallback)

    @property
    def accuracy(self) -> float:
        return self.passed / self.n if self.n else float("nan")


def read_score_inputs(path: str) -> list[dict[str, Any]]:
    """Read and validate `score-calls` input lines; errors name the file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON: {exc}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: each line must be a JSON object")
            missing = [k for k in _SCORE_KEYS if k not in row]
            if missing:
                raise ValueError(f"{path}:{lineno}: missing key(s) {', '.join(missing)} "
                                 f"(each line needs {', '.join(_SCORE_KEYS)})")
            if not isinstance(row["candidate"], list):
                raise ValueError(f"{path}:{lineno}: 'candidate' must be a list of "
                                 f"{{name, arguments}} calls")
            rows.append(row)
    return rows


def score_calls(reward_id: str, input_path: str, output_path: str, *,
                kwargs: Mapping[str, Any] | None = None,
                pass_threshold: float = 1.0) -> dict[str, CategoryStats]:
    """Score candidate calls offline with a registered reward (the training code path).

    Writes one ``{"id", "score", "error"}`` line per input line to ``output_path`` and returns
    per-category stats (a sample passes when its score >= ``pass_threshold``), plus ``"all"``.
    """
    from toolrl.core.reward import Trajectory, build_reward

    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ValueError(f"reward kwargs must be a JSON object, got {kwargs!r}")
    rows = read_score_inputs(input_path)
    trajs = []
    for row in rows:
        try:
            calls = [as_tool_call(c) for c in row["candidate"]]
        except ValueError:  # an undecodable candidate is scored as the model's garbage output
            calls = None
        task = {"id": row["id"], "category": row["category"], "ground_truth": row["ground_truth"]}
        traj = Trajectory.from_calls(calls or [], task, row["tools"])
        if calls is None:
            traj.turns[0].parse = ParseResult(calls=[], text="", errors=[
                ParseError("bad_arguments", "candidate calls could not be decoded")])
        trajs.append(traj)
    with build_reward({"rewards": [{"name": reward_id, "kwargs": dict(kwargs or {})}]}) as fn:
        result = fn.score(trajs)
    alias = reward_id
    failed = {f.index: f.message for f in result.failures}
    groups: dict[str, list[tuple[float, bool]]] = {}
    with open(output_path, "w", encoding="utf-8") as out:
        for i, row in enumerate(rows):
            score = result.components[alias][i]
            error = failed.get(i) or result.reasons[alias][i]
            out.write(json.dumps({"id": row["id"], "score": score, "error": error}) + "\n")
            for key in (str(row["category"]), "all"):
                groups.setdefault(key, []).append((score, i in failed))
    return {key: CategoryStats(n=len(v), passed=sum(s >= pass_threshold for s, _ in v),
                               mean_score=sum(s for s, _ in v) / len(v),
                               errors=sum(e for _, e in v))
            for key, v in sorted(groups.items(), key=lambda kv: (kv[0] == "all", kv[0]))}


def stats_table(stats: Mapping[str, CategoryStats], title: str = "score-calls") -> Any:
    """A rich Table of per-category accuracy."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("category", "n", "accuracy", "mean score", "errors"):
        table.add_column(col, justify="left" if col == "category" else "right")
    for key, s in stats.items():
        table.add_row(key, str(s.n), f"{s.accuracy:.3f}", f"{s.mean_score:.3f}", str(s.errors))
    return table
