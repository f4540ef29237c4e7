"""toolrl's BFCL checker against BFCL's own ``ast_checker`` on BFCL v4's single-turn AST
categories, Java and JavaScript included: every shipped row's possible answer, as the calls
that stand for it, and perturbed candidates around it.

BFCL's ``ast_checker`` runs as BFCL's package has it, with one thing replaced: its module
imports BFCL's model registry (``constants.model_config``, which imports every provider SDK),
used only to ask whether a model writes ``.`` in function names as ``_``; the registry here
is one entry, a model that keeps names as given (as toolrl's env offers them).

Candidates per row (`candidates`): the answer's calls (``gold``); a string argument changed; a
number changed; a parameter dropped; an unexpected parameter; an argument given as a JSON value
instead of source code (Java/JavaScript); a Java long/float without its suffix; a boolean
written ``True``; a source string in quotes; the dotted name written with ``_``; the call
twice; no call. Each is scored by both; the verdicts (and error types) must agree.

Writes benchmarks/results/bfcl_ast.md and .json.

    .venv/bin/python benchmarks/bench_bfcl_ast.py [--quick] [--only simple_java ...]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import md_table

RESULTS = benchlib.RESULTS_DIR / "bfcl_ast.md"
LANGUAGE_CATEGORIES = ("simple_java", "simple_javascript")
PYTHON_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple",
                     "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
MODEL = "toolrl-model"


def bfcl_ast_checker() -> Any:
    """BFCL's ``ast_checker`` (module docstring: its model registry is one entry)."""
    if "bfcl_eval.constants.model_config" not in sys.modules:
        registry = types.ModuleType("bfcl_eval.constants.model_config")
        registry.MODEL_CONFIG_MAPPING = {
            MODEL.replace("_", "/"): types.SimpleNamespace(underscore_to_dot=False)}
        sys.modules["bfcl_eval.constants.model_config"] = registry
    from bfcl_eval.eval_checker.ast_eval import ast_checker

    return ast_checker


def bfcl_verdict(functions: list[dict], calls: list[Any], truth: list, category: str
                 ) -> tuple[bool, str]:
    from bfcl_eval.constants.enums import Language

    checker = bfcl_ast_checker()
    language = {"simple_java": Language.JAVA, "simple_javascript": Language.JAVASCRIPT
                }.get(category, Language.PYTHON)
    output = [{c.name: dict(c.arguments)} for c in calls]
    result = checker.ast_checker(functions, output, truth, language, category, MODEL)
    return bool(result["valid"]), "" if result["valid"] else str(result["error_type"])


def toolrl_verdict(tools: list[dict], calls: list[Any], truth: list, category: str
                   ) -> tuple[bool, str]:
    from toolrl.core import bfcl

    result = bfcl.check_calls(calls, truth, category, tools)
    return result.valid, result.error_type


# --- candidates ------------------------------------------------------------------------------
def _changed_source(value: str, rng: random.Random) -> str | None:
    import re

    number = re.fullmatch(r"(-?\d+)([lLfFn]?)", value)
    if number:
        return f"{int(number.group(1)) + rng.choice([1, 2, -1])}{number.group(2)}"
    return value + "x" if value else None


def candidates(calls: list[Any], schemas: dict[str, dict], category: str,
               seed: str) -> dict[str, list[Any]]:
    """Perturbed candidates around the answer's calls (module docstring); kinds that do not
    apply are left out."""
    from toolrl import ToolCall

    rng = random.Random(seed)
    out: dict[str, list[Any]] = {"gold": list(calls), "no_call": [],
                                 "twice": [*calls, *calls]}
    language = category in LANGUAGE_CATEGORIES
    call = rng.choice(calls)
    at = calls.index(call)

    def replace(arguments: dict[str, Any], name: str | None = None) -> list[Any]:
        new = list(calls)
        new[at] = ToolCall(name or call.name, arguments)
        return new

    args = dict(call.arguments)
    props = (schemas.get(call.name) or {}).get("properties") or {}
    if args:
        key = rng.choice(sorted(args))
        out["dropped_param"] = replace({k: v for k, v in args.items() if k != key})
        strings = [k for k, v in args.items() if isinstance(v, str) and v]
        if strings:
            k = rng.choice(strings)
            out["changed_string"] = replace({**args, k: args[k] + "x"})
        if language:
            numbers = [k for k, v in args.items() if isinstance(v, str)
                       and _changed_source(v, rng) and v[:1].lstrip("-").isdigit()]
            if numbers:
                k = rng.choice(numbers)
                out["changed_number"] = replace({**args, k: _changed_source(args[k], rng)})
            k = rng.choice(sorted(args))
            out["json_value"] = replace({**args, k: _json_value(args[k])})
            quoted = [k for k, v in args.items() if isinstance(v, str)
                      and not v.startswith(('"', "'", "[", "{", "new "))]
            if quoted:
                k = rng.choice(quoted)
                out["quoted_source"] = replace({**args, k: f'"{args[k]}"'})
            suffixed = [k for k, v in args.items() if isinstance(v, str)
                        and v[-1:] in ("L", "f") and v[:-1].replace(".", "").lstrip("-").isdigit()]
            if suffixed:
                k = rng.choice(suffixed)
                out["no_suffix"] = replace({**args, k: args[k][:-1]})
            booleans = [k for k, v in args.items() if v in ("true", "false")]
            if booleans:
                k = rng.choice(booleans)
                out["capital_boolean"] = replace({**args, k: args[k].capitalize()})
        else:
            numbers = [k for k, v in args.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if numbers:
                k = rng.choice(numbers)
                out["changed_number"] = replace({**args, k: args[k] + 1})
            booleans = [k for k, v in args.items() if isinstance(v, bool)]
            if booleans:
                k = rng.choice(booleans)
                out["flipped_boolean"] = replace({**args, k: not args[k]})
            typed = [k for k, v in args.items() if isinstance(v, (int, float, bool))]
            if typed:
                k = rng.choice(typed)
                out["json_value"] = replace({**args, k: str(args[k])})
    unknown = next(f"extra_{i}" for i in range(99) if f"extra_{i}" not in props)
    out["unexpected_param"] = replace({**args, unknown: "x" if language else 1})
    if "." in call.name:
        out["underscore_name"] = replace(args, call.name.replace(".", "_"))
    return out


def _json_value(source: str) -> Any:
    try:
        return json.loads(source)
    except (TypeError, ValueError):
        return 0


# --- the run ---------------------------------------------------------------------------------
def bfcl_rows(category: str) -> list[tuple[dict, dict, list]]:
    """(toolrl row, BFCL's own entry, its possible answer) of a category, from the wheel."""
    import bfcl_eval

    from toolrl.data import load_bfcl

    data = Path(bfcl_eval.__file__).parent / "data"
    name = f"BFCL_v4_{category}.json"
    entries = {e["id"]: e for e in map(json.loads, (data / name).read_text().splitlines())}
    answers = {a["id"]: a["ground_truth"] for a in map(
        json.loads, (data / "possible_answer" / name).read_text().splitlines())}
    return [(row, entries[row["id"]], answers[row["id"]])
            for row in load_bfcl(data / name)]


def run(categories: list[str], limit: int | None) -> dict[str, Any]:
    from toolrl.core import bfcl

    out: dict[str, Any] = {"categories": {}, "mismatches": [], "gold_fails": []}
    for category in categories:
        counts: dict[str, Counter] = {}
        for row, entry, truth in bfcl_rows(category)[:limit]:
            functions = entry["function"] if isinstance(entry["function"], list) \
                else [entry["function"]]
            tools = row["tools"]
            gold = bfcl.ground_truth_calls(truth, tools, category)
            for kind, calls in candidates(gold, bfcl.tool_schemas(tools), category,
                                          row["id"]).items():
                mine = toolrl_verdict(tools, calls, truth, category)
                try:
                    theirs = bfcl_verdict(functions, calls, truth, category)
                except Exception as exc:  # BFCL's checker raised: toolrl must fail it too
                    theirs = (False, f"raised {type(exc).__name__}")
                c = counts.setdefault(kind, Counter())
                c["total"] += 1
                c["bfcl_valid"] += theirs[0]
                if mine[0] != theirs[0]:
                    c["verdict_mismatches"] += 1
                    out["mismatches"].append({"id": row["id"], "kind": kind,
                                              "toolrl": list(mine), "bfcl": list(theirs)})
                elif mine[1] != theirs[1]:
                    c["error_type_differs"] += 1
                    c[f"{mine[1]} vs {theirs[1]}"] += 1
                if kind == "gold" and not theirs[0]:
                    out["gold_fails"].append({"id": row["id"], "bfcl": theirs[1]})
        out["categories"][category] = {k: dict(v) for k, v in counts.items()}
    return out


def report(result: dict[str, Any], seconds: float, argv: list[str], machine: str) -> str:
    cats = result["categories"]
    total = sum(v["total"] for c in cats.values() for v in c.values())
    bad = len(result["mismatches"])
    gold = {c: v.get("gold", {}) for c, v in cats.items()}
    differs = Counter()
    for c in cats.values():
        for v in c.values():
            differs.update({k: n for k, n in v.items() if " vs " in k})
    lines = [
        "## BFCL single-turn AST categories (Python, Java, JavaScript): toolrl's checker "
        "against BFCL's own",
        "",
        f"**{bad} of {total:,} candidate answers get a different verdict from toolrl's "
        f"checker than from BFCL's `ast_checker`.**",
        "",
        f"Every shipped row's possible answer (as the calls that stand for it: each value as "
        f"source code BFCL's converter reads back) and perturbed candidates around it, scored "
        f"by toolrl (`toolrl.core.bfcl.check_calls`) and by BFCL's `ast_checker` (its model "
        f"registry replaced by one model that keeps function names as given). {seconds:.0f} s "
        f"in all.",
        "",
        f"Machine: {machine}. Command: "
        f"`{benchlib.command_line('bench_bfcl_ast.py', argv)}`.",
        "",
        md_table(["category", "rows", "answer passes BFCL", "candidates", "BFCL valid",
                  "verdicts differ", "error types differ"],
                 [(c, gold[c].get("total", 0), gold[c].get("bfcl_valid", 0),
                   sum(v["total"] for v in k.values()),
                   sum(v["bfcl_valid"] for v in k.values()),
                   sum(v.get("verdict_mismatches", 0) for v in k.values()),
                   sum(v.get("error_type_differs", 0) for v in k.values()))
                  for c, k in cats.items()]),
        "",
    ]
    kinds = sorted({k for c in cats.values() for k in c})
    rows = [(k, sum(c.get(k, {}).get("total", 0) for c in cats.values()),
             sum(c.get(k, {}).get("bfcl_valid", 0) for c in cats.values()),
             sum(c.get(k, {}).get("verdict_mismatches", 0) for c in cats.values()))
            for k in kinds]
    lines += ["Per kind of candidate:", "", md_table(["kind", "candidates", "BFCL valid",
                                                       "verdicts differ"], rows), ""]
    if result["gold_fails"]:
        lines += ["Rows whose possible answer BFCL itself fails (toolrl fails them too): " +
                  ", ".join(f"`{g['id']}` ({g['bfcl']})" for g in result["gold_fails"]), ""]
    if differs:
        lines += ["Same verdict, another error type (toolrl's vs BFCL's): " +
                  "; ".join(f"{k}: {n}" for k, n in differs.most_common()), ""]
    for m in result["mismatches"][:10]:
        lines.append(f"- mismatch: {m['id']} ({m['kind']}): toolrl {m['toolrl']}, BFCL "
                     f"{m['bfcl']}")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="10 rows per category")
    p.add_argument("--only", nargs="+", metavar="CATEGORY", default=None,
                   choices=[*LANGUAGE_CATEGORIES, *PYTHON_CATEGORIES],
                   help="these categories only")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--limit", type=int, default=None, help="rows per category")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.limit = min(args.limit or 10, 10)
    categories = args.only or [*LANGUAGE_CATEGORIES, *PYTHON_CATEGORIES]
    if args.dry_run:
        print(f"bfcl ast agreement plan: {categories}, {args.limit or 'all'} rows each -> "
              f"{args.output}")
        return 0
    machine = benchlib.machine_label()
    start = time.perf_counter()
    result = run(categories, args.limit)
    seconds = time.perf_counter() - start
    benchlib.write_result(args.output, report(result, seconds, argv, machine))
    args.output.with_suffix(".json").write_text(json.dumps(
        {"machine": machine, "command": benchlib.command_line("bench_bfcl_ast.py", argv),
         "date": time.strftime("%Y-%m-%d"), "seconds": round(seconds, 1), **result},
        indent=2) + "\n")
    return 1 if result["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
