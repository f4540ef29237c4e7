"""``--from nestful``: NESTFUL's records (IBM, Apache-2.0) as FunctionCalling rows.

NESTFUL ships inside the ``nestful-wrapper`` wheel (`toolrl.wheels.NESTFUL`) as split pairs
``<split>-data.json`` (records: ``input``, the question, and ``output``, a sequence of calls,
each ``{name, arguments, label}``, ending in a ``var_result`` call that collects the answer)
and ``<split>-spec.json`` (the functions: ``name``, ``description``, ``query_parameters``
``{param: {type, description, required, default | default_value, enum | allowed_values}}``).
Splits: ``non-executable-glaive`` (169), ``non-executable-sgd`` (46), ``executable`` (85),
``complexfuncbench`` (1,000, 200 MB with recorded responses: only when named).

Most records are sequences of *dependent* calls (``"$var1.distance$"`` uses call ``var1``'s
output), which a FunctionCalling row (one turn, nothing executed) cannot score. A record
becomes the row of its first turn: the question, the tools the record calls (from the spec),
and as the answer its *first wave*: every call whose arguments use no earlier output, made
together in one turn, the turn a model must make before any result exists. A record whose
calls all depend on others gives no row (skipped, counted).

Parameters become JSON Schema: a missing or unknown ``type`` is ``string`` (SGD's values are
strings), ``allowed_values`` an ``enum``, ``default_value`` a ``default``, ``required: true``
the ``required`` list; the rest (``items``, ``properties``, ``format``, bounds) is kept.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from toolrl.core.bfcl import as_tool_call
from toolrl.data.records import SkipRecord, function_row
from toolrl.wheels import NESTFUL, obtain_wheel

DEFAULT_SPLITS = ("non-executable-glaive", "non-executable-sgd", "executable")
_REFERENCE = re.compile(r"\$([A-Za-z_][\w-]*)(?:[.\[][^$]*)?\$")
_TYPES = {"string": "string", "str": "string", "integer": "integer", "int": "integer",
          "number": "number", "float": "number", "boolean": "boolean", "bool": "boolean",
          "array": "array", "list": "array", "object": "object", "dict": "object"}
_KEEP = ("description", "items", "properties", "format", "minimum", "maximum")


def data_files(path: str | os.PathLike | None = None) -> list[Path]:
    """The ``*-data.json`` files to read: ``path`` itself (a data file), every split under a
    folder, or (None) the default splits of the ``nestful-wrapper`` wheel."""
    if path is None:
        wheel = obtain_wheel(NESTFUL)
        files = [f for split in DEFAULT_SPLITS for f in wheel.find(f"**/{split}-data.json")]
        if len(files) != len(DEFAULT_SPLITS):
            raise ValueError(f"{wheel.name} {wheel.version} ({wheel.root}) lacks some of "
                             f"NESTFUL's splits {DEFAULT_SPLITS}")
        return files
    path = Path(path)
    if path.is_dir():
        files = sorted(path.rglob("*-data.json"))
        if not files:
            raise ValueError(f"{path} holds no NESTFUL *-data.json file")
        return files
    if not path.name.endswith("-data.json"):
        raise ValueError(f"{path}: a NESTFUL data file is named <split>-data.json (its "
                         f"functions in <split>-spec.json beside it)")
    return [path]


def load_records(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The records of one data file (or of every split under a folder), each with
    ``split``, ``index`` and ``spec`` (the spec of the functions it calls)."""
    for data in data_files(path):
        split = data.name[: -len("-data.json")]
        spec_path = data.with_name(f"{split}-spec.json")
        if not spec_path.exists():
            raise ValueError(f"{data}: its functions are not at {spec_path}")
        spec = {s["name"]: s for s in json.loads(spec_path.read_text(encoding="utf-8"))}
        for index, record in enumerate(json.loads(data.read_text(encoding="utf-8"))):
            calls = [c for c in record.get("output") or [] if c.get("name") != "var_result"]
            yield {"id": f"nestful-{split}-{index}", "split": split, "question":
                   record.get("input"), "calls": calls,
                   "spec": {c["name"]: spec[c["name"]] for c in calls if c.get("name") in spec},
                   "missing": sorted({str(c.get("name")) for c in calls} - set(spec))}


def convert_record(record: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """The row of a record's first turn (see the module docstring)."""
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("no question ('input')")
    if record.get("missing"):
        raise ValueError(f"calls functions its spec lacks: {record['missing']}")
    calls = list(record.get("calls") or [])
    if not calls:
        raise SkipRecord("no call")
    first = first_wave(calls)
    if not first:
        raise SkipRecord("every call uses an earlier call's output")
    tools = [tool_schema(s) for s in record["spec"].values()]
    question = " ".join(question.split())
    row = function_row(f"nestful/{record.get('split')}", str(record.get("id", index)),
                       [{"role": "user", "content": question}], tools,
                       [as_tool_call({"name": c["name"], "arguments": c.get("arguments") or {}})
                        for c in first])
    return [row]


def first_wave(calls: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The calls whose arguments use no other call's output (a ``$label...$`` reference)."""
    labels = {c.get("label") for c in calls if c.get("label")}
    return [c for c in calls
            if not any(m.group(1) in labels
                       for m in _REFERENCE.finditer(json.dumps(c.get("arguments"))))]


def tool_schema(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A NESTFUL function spec as an OpenAI function with a JSON Schema."""
    params = spec.get("query_parameters") or {}
    properties = {}
    for name, p in params.items():
        p = p if isinstance(p, Mapping) else {}
        prop: dict[str, Any] = {"type": _TYPES.get(str(p.get("type", "string")).lower(),
                                                  "string")}
        prop.update({k: p[k] for k in _KEEP if p.get(k) not in (None, "", [], {})})
        enum = p.get("enum") or p.get("allowed_values")
        if enum:
            prop["enum"] = list(enum)
        default = p.get("default", p.get("default_value"))
        if default not in (None, ""):
            prop["default"] = default
        properties[name] = prop
    required = [n for n, p in params.items() if isinstance(p, Mapping) and p.get("required") is
                True]
    return {"name": spec["name"], "description": str(spec.get("description") or ""),
            "parameters": {"type": "object", "properties": properties, "required": required}}


__all__ = ["DEFAULT_SPLITS", "convert_record", "data_files", "first_wave", "load_records",
           "tool_schema"]
