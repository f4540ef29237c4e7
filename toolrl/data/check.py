"""One check of task rows, used everywhere rows enter: `toolrl data convert` (before a row is
written), ``toolrl train --dry-run``, ``toolrl train``'s pre-flight and ``toolrl eval``
(`toolrl.trainer.preflight.check_task_rows` adds the prompt budget, which needs the model's
tokenizer).

Per row:

- every tool has a name, and no two tools share one (``duplicate tool name``);
- every tool's parameters schema is valid JSON Schema (jsonschema's own metaschema check, after
  BFCL's type names are read as JSON Schema's): an unknown type such as ``"strnig"`` is caught
  here (``invalid tool schema``);
- FunctionCalling rows (``env`` ``toolrl/FunctionCalling-v0``): the ground truth is BFCL
  possible answers whose functions the row offers, and the calls it stands for
  (`toolrl.core.bfcl.ground_truth_calls`) pass both the BFCL checker and the tools' own
  schemas (``gold answer``). A required parameter whose only gold value is ``""`` (BFCL's
  mark for "may be omitted") is explained as such;
- BFCLMultiTurn rows (``env`` ``toolrl/BFCLMultiTurn-v0``): the entry is in BFCL's shape
  (`toolrl.core.bfcl_multi_turn.Entry`) and its backends load its initial configuration; its
  possible answer's calls are methods of the involved classes taking those arguments
  (``unplayable gold answer``), and, played, BFCL's multi-turn checker passes them
  (``gold answer``);
- (`toolrl.trainer.preflight.check_task_rows`) the row's first prompt renders in its env, and
  fits the prompt budget.

`RowReport` holds the counts and every offender; its `summary` is one line of counts followed by
one line per offender (the first few), each with the row's index, id and reason.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from toolrl.core import bfcl
from toolrl.core import bfcl_multi_turn as mt
from toolrl.core.registration import env_of
from toolrl.core.tools import Tool, normalize_parameters
from toolrl.data.bfcl import FUNCTION_CALLING_ENV, category_from_id
from toolrl.data.bfcl_multi_turn import ENV as MULTI_TURN_ENV

__all__ = ["RowProblem", "RowReport", "check_rows", "normalize_row", "row_problems"]

Row = dict[str, Any]
SHOWN = 5
"""Offenders a summary names (the report keeps all of them)."""

_JSON_FIELDS = ("messages", "tools", "ground_truth", "question", "function")


# --- the FunctionCalling row layout ----------------------------------------------------------
def normalize_row(row: Mapping[str, Any]) -> Row:
    """A BFCL-layout or toolrl row in toolrl's form (``messages``, ``tools``, ``category``), a
    copy. Nested fields stored as JSON strings (parquet, CSV) are decoded. The category is the
    row's own, else BFCL's reading of its id when that names a BFCL category, else the one its
    ground truth and tools imply (`category_of`)."""
    row = dict(row)
    for key in _JSON_FIELDS:
        value = row.get(key)
        if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
            row[key] = json.loads(value)
    if "messages" not in row and "question" in row:
        question = row.pop("question")
        if isinstance(question, str):
            row["messages"] = [{"role": "user", "content": question}]
        elif question and isinstance(question[0], list):  # BFCL: a list of turns
            if len(question) != 1:
                raise ValueError(f"row {row.get('id')!r} has {len(question)} turns; "
                                 f"FunctionCalling rows are single-turn (BFCL's multi-turn "
                                 f"entries are toolrl/BFCLMultiTurn-v0 rows: toolrl data "
                                 f"convert --from bfcl)")
            row["messages"] = list(question[0])
        else:
            row["messages"] = list(question)
    if "tools" not in row and "function" in row:
        functions = row.pop("function")
        functions = functions if isinstance(functions, list) else [functions]
        row["tools"] = [f if isinstance(f, Mapping) and f.get("type") == "function"
                        and "function" in f else {"type": "function", "function": f}
                        for f in functions]
    if not row.get("category"):
        from_id = category_from_id(str(row.get("id", "")))
        if from_id in bfcl.SCORABLE or from_id in bfcl.BFCL_UNSCORABLE:  # the id names it
            row["category"] = from_id
        elif isinstance(row.get("ground_truth"), list):
            row["category"] = bfcl.category_of(len(row["ground_truth"]),
                                               len(row.get("tools") or []))
    return row


# --- one row ---------------------------------------------------------------------------------
def row_problems(row: Mapping[str, Any], default_env: str = FUNCTION_CALLING_ENV
                 ) -> list[tuple[str, str]]:
    """``(kind, reason)`` for everything wrong with one row (empty: nothing found)."""
    env_id = env_of(row, default_env)
    if env_id == MULTI_TURN_ENV:
        return _multi_turn_problems(row)
    try:
        row = normalize_row(row) if env_id == FUNCTION_CALLING_ENV else dict(row)
    except (ValueError, TypeError) as exc:
        return [("malformed row", str(exc))]
    if "tools" not in row:
        return []
    raw = row["tools"]
    language = bfcl.language_of(row.get("category"))
    if language is not None and isinstance(raw, list):  # checked as the env presents them
        try:
            raw = bfcl.presented_tools(raw, language)
        except (AttributeError, TypeError) as exc:
            return [("invalid tool schema", f"{type(exc).__name__}: {exc}")]
    tools, problems = _tool_problems(raw)
    if problems or env_id != FUNCTION_CALLING_ENV:
        return problems
    return _gold_problems(row, tools)


def _tool_problems(raw: Any) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The row's tools by name (`toolrl.core.tools.Tool`) and what is wrong with them."""
    if not isinstance(raw, list):
        return {}, [("invalid tool schema", f"'tools' must be a list, got "
                                            f"{type(raw).__name__}")]
    tools: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for i, schema in enumerate(raw):
        if not isinstance(schema, Mapping):
            problems.append(("invalid tool schema", f"tool {i} is not an object"))
            continue
        function = schema.get("function", schema) if schema.get("type") == "function" \
            else schema
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            fields = ", ".join(map(str, function)) if isinstance(function, Mapping) else "none"
            problems.append(("invalid tool schema", f"tool {i} has no name (fields: {fields})"))
            continue
        if name in tools:
            problems.append(("duplicate tool name", f"two tools are named {name!r}"))
            continue
        tool, problem = _tool(json.dumps(schema, sort_keys=True, default=str))
        if problem:
            problems.append(("invalid tool schema", problem))
        else:
            tools[name] = tool
    return tools, problems


@functools.lru_cache(maxsize=4096)  # datasets repeat their tools across rows
def _tool(schema_json: str) -> tuple[Any, str | None]:
    """(the `Tool` of an OpenAI tool schema, None) or (None, why it is not valid)."""
    schema = json.loads(schema_json)
    try:
        return Tool.from_schema(schema), None
    except (ValueError, TypeError) as exc:
        function = schema.get("function", schema) if schema.get("type") == "function" \
            else schema
        return None, _schema_error(function["name"], function.get("parameters")) or str(exc)


def _schema_error(name: str, parameters: Any) -> str | None:
    """Why ``parameters`` is not valid JSON Schema (jsonschema's metaschema check, after BFCL's
    type names are read as JSON Schema's), naming the parameter; None when it is valid."""
    if parameters is None:
        return None
    if not isinstance(parameters, Mapping):
        return f"tool {name!r}: 'parameters' must be an object"
    schema = normalize_parameters(dict(parameters))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = best_match(cls(cls.META_SCHEMA).iter_errors(schema))
    if error is None:
        return None
    path = list(error.absolute_path)
    if path and path[-1] == "type" and isinstance(error.instance, str):
        where = ".".join(str(p) for p in path[:-1] if p != "properties") or "parameters"
        return f"tool {name!r}: parameter {where!r} has an unknown type {error.instance!r}"
    where = "/".join(map(str, path)) or "the root"
    return f"tool {name!r}: invalid parameters schema at {where}: {error.message}"


def _gold_problems(row: Mapping[str, Any], tools: Mapping[str, Any]) -> list[tuple[str, str]]:
    if "ground_truth" not in row:
        if row.get("category") in ("irrelevance", "relevance"):
            return []
        return [("gold answer", "no 'ground_truth'")]
    truth = row["ground_truth"]
    try:
        expected = bfcl.parse_ground_truth(truth)
        bfcl.check_mode(row.get("category"), len(expected))
    except (ValueError, TypeError) as exc:
        return [("gold answer", str(exc))]
    for name, _ in expected:
        if name not in tools:
            return [("gold answer calls a function not offered",
                     f"{name!r} is not among the row's tools ({', '.join(tools) or 'none'})")]
    if bfcl.check_mode(row.get("category"), len(expected)) in ("irrelevance", "relevance"):
        return []
    for name, params in expected:
        required = tools[name].parameters.get("required") or []
        for param in required:
            if param in params and all(v == "" for v in params[param]):
                return [("gold answer", f"{name}: required parameter {param!r} has only '' as "
                                        f"its gold value, BFCL's mark for 'may be omitted', "
                                        f"which a required parameter cannot be (only a call "
                                        f"passing '' itself passes); give a value or drop "
                                        f"{param!r} from the tool's required list")]
    try:
        own = list(row["tools"]) if bfcl.language_of(row.get("category")) else \
            [t.schema for t in tools.values()]  # a language's calls need its own types
        calls = bfcl.ground_truth_calls(truth, own, row.get("category"))
        verdict = bfcl.check_calls(calls, truth, row.get("category"), list(row["tools"]))
    except ValueError as exc:
        return [("gold answer", str(exc))]
    if not verdict.valid:
        return [("gold answer", f"the calls it stands for fail the BFCL check: "
                                f"{verdict.error}")]
    for call in calls:
        error = tools[call.name].validate(call.arguments)
        if error is not None:
            return [("gold answer", f"fails its tool's schema: {error['message']}")]
    return []


def _multi_turn_problems(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    try:
        mt.require_bfcl_eval()
        entry = mt.Entry.from_row(row)
        mt.Backends(entry)
    except ImportError as exc:
        return [("cannot check", str(exc))]
    except mt.GroundTruthError as exc:
        return [("unplayable gold answer", str(exc))]
    except (ValueError, TypeError) as exc:
        return [("malformed row", str(exc))]
    verdict = mt.checker_verdict(entry, [[turn] if turn else []
                                         for turn in mt.ground_truth_calls(entry)])
    if not verdict.valid:
        return [("gold answer", f"played, it fails BFCL's multi-turn checker: "
                                f"{verdict.error_type}: {verdict.error}")]
    return []


# --- many rows -------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowProblem:
    """One offending row: where it is in its file, its id, what kind of problem, and why."""

    index: int
    row_id: Any
    kind: str
    reason: str
    blocking: bool = True  # False: BFCL's own data, scored as BFCL scores it (a note)

    def line(self) -> str:
        note = "" if self.blocking else " (BFCL's own data: kept and scored as BFCL does)"
        return f"row {self.index} (id {self.row_id!r}): {self.kind}: {self.reason}{note}"


@dataclass
class RowReport:
    """What `check_rows` found in one source of rows (``where``: e.g. ``data.train_file``)."""

    where: str
    rows: int
    problems: list[RowProblem] = field(default_factory=list)

    @property
    def blocking(self) -> list[RowProblem]:
        """The problems that refuse the rows (the others are notes on BFCL's own data)."""
        return [p for p in self.problems if p.blocking]

    @property
    def notes(self) -> list[RowProblem]:
        return [p for p in self.problems if not p.blocking]

    @property
    def ok(self) -> bool:
        return not self.blocking

    @property
    def bad_rows(self) -> int:
        return len({p.index for p in self.blocking})

    def counts(self, blocking: bool = True) -> Counter[str]:
        """Offending rows per kind of problem."""
        return Counter(kind for kind, _ in {(p.kind, p.index) for p in self.problems
                                            if p.blocking == blocking})

    def headline(self) -> str:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.counts().items()))
        return f"{self.where}: {self.bad_rows} of {self.rows} rows have problems ({kinds})"

    def summary(self, shown: int = SHOWN) -> str:
        """The counts, then one line per offender (the first ``shown``)."""
        return _lines(self.headline(), self.blocking, shown)

    def notes_summary(self, shown: int = SHOWN) -> str:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.counts(False).items()))
        rows = len({p.index for p in self.notes})
        return _lines(f"{self.where}: {rows} of {self.rows} rows of BFCL's own data have gold "
                      f"answers their tools' schemas reject ({kinds}); BFCL scores them as "
                      f"they are, and so does toolrl", self.notes, shown)

    def add(self, index: int, row: Mapping[str, Any], kind: str, reason: str) -> None:
        blocking = not (row.get("source") == "bfcl" and kind == "gold answer")
        self.problems.append(RowProblem(index, row.get("id"), kind, reason, blocking))


def _lines(headline: str, problems: Sequence[RowProblem], shown: int) -> str:
    lines = [headline, *(f"  {p.line()}" for p in problems[:shown])]
    if len(problems) > shown:
        lines.append(f"  ... and {len(problems) - shown} more")
    return "\n".join(lines)


def check_rows(rows: Iterable[Mapping[str, Any]], where: str,
               default_env: str = FUNCTION_CALLING_ENV) -> RowReport:
    """`row_problems` of every row (``default_env``: the env of rows that name none)."""
    rows = list(rows)
    report = RowReport(where, len(rows))
    for i, row in enumerate(rows):
        for kind, reason in row_problems(row, default_env):
            report.add(i, row, kind, reason)
    return report
