"""Generate tests/data/score_calls_cases.jsonl: hand-labelled cases for `toolrl score-calls`.

Each case applies one *case type* (a mutation of a correct answer) to a scenario. The expected
verdict of every case type is written below by reasoning from the BFCL AST-checker rules (see
toolrl/core/bfcl.py's docstring); the checker itself is never run here. Re-generate with

    .venv/bin/python tests/data/make_score_calls_cases.py

Lines: id, category, tools, ground_truth, candidate (the score-calls input) plus ``expected``
(the hand label: does the candidate pass?), ``case`` (the case type) and ``why``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any


def fn(name: str, props: dict[str, Any], required: list[str], desc: str = "") -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": desc or name.replace("_", " "),
        "parameters": {"type": "object", "properties": props, "required": required}}}


S = {"type": "string"}
I = {"type": "integer"}  # noqa: E741
N = {"type": "number"}
B = {"type": "boolean"}

# A scenario: a tool, its ground truth, and which parameter plays which role in the mutations.
# roles: str (string param, value with letters), num (number param, integral value), int
# (integer param), bool, opt (acceptable values include ""), nonopt (not required by the schema
# but no "" in the answers), req (required by the schema), list (array, >= 2 distinct items),
# strlist (array of strings), dict (object param), only_omit (acceptable values are only "").
SCENARIOS: list[dict[str, Any]] = [
    {
        "tool": fn("get_weather", {"city": S, "unit": {**S, "enum": ["celsius", "fahrenheit"]},
                                   "days": I, "include_hourly": B, "lang": S}, ["city"]),
        "gt": {"city": ["San Francisco, CA", "San Francisco"], "unit": ["fahrenheit", ""],
               "days": [3], "include_hourly": [False, ""]},
        "roles": {"str": "city", "int": "days", "bool": "include_hourly", "opt": "unit",
                  "nonopt": "days", "req": "city", "schema_only": "lang"},
    },
    {
        "tool": fn("calculate_triangle_area", {"base": N, "height": N, "unit": S},
                   ["base", "height"]),
        "gt": {"base": [10], "height": [5.5], "unit": ["cm", "centimeters", ""]},
        "roles": {"str": "unit", "num": "base", "opt": "unit", "req": "height"},
    },
    {
        "tool": fn("book_flight", {"origin": S, "destination": S, "date": S, "passengers": I,
                                   "refundable": B}, ["origin", "destination", "date"]),
        "gt": {"origin": ["New York", "NYC"], "destination": ["Los Angeles", "LAX"],
               "date": ["2024-04-01", "April 1, 2024"], "passengers": [2],
               "refundable": [True, ""]},
        "roles": {"str": "origin", "int": "passengers", "bool": "refundable", "opt": "refundable",
                  "nonopt": "passengers", "req": "date"},
    },
    {
        "tool": fn("sort_numbers", {"numbers": {"type": "array", "items": I},
                                    "descending": B}, ["numbers"]),
        "gt": {"numbers": [[5, 3, 9, 1]], "descending": [True]},
        "roles": {"list": "numbers", "bool": "descending", "nonopt": "descending",
                  "req": "numbers"},
    },
    {
        "tool": fn("search_hotels", {
            "location": S,
            "filters": {"type": "object", "properties": {
                "max_price": N, "amenities": {"type": "array", "items": S}, "rating": I}},
        }, ["location", "filters"]),
        "gt": {"location": ["Paris, France", "Paris"],
               "filters": [{"max_price": [200], "amenities": [["wifi", "pool"]],
                            "rating": [4, ""]}]},
        "roles": {"str": "location", "dict": "filters", "req": "location"},
        "dict_roles": {"num": "max_price", "int": "rating", "opt": "rating",
                       "strlist": "amenities", "nonopt": "max_price"},
    },
    {
        "tool": fn("send_email", {"to": S, "subject": S, "body": S,
                                  "cc": {"type": "array", "items": S}}, ["to", "subject", "body"]),
        "gt": {"to": ["alice@example.com"], "subject": ["Meeting Tomorrow"],
               "body": ["See you at 10am"], "cc": [["bob@example.com", "carol@example.com"], ""]},
        "roles": {"str": "subject", "opt": "cc", "req": "body", "strlist": "cc", "list": "cc"},
    },
    {
        "tool": fn("convert_currency", {"amount": N, "from_currency": S, "to_currency": S},
                   ["amount", "from_currency", "to_currency"]),
        "gt": {"amount": [100], "from_currency": ["USD"], "to_currency": ["EUR"]},
        "roles": {"str": "to_currency", "num": "amount", "req": "from_currency"},
    },
    {
        "tool": fn("get_stock_price", {"ticker": S, "exchange": S, "as_of": S}, ["ticker"]),
        "gt": {"ticker": ["AAPL"], "exchange": ["NASDAQ", ""], "as_of": [""]},
        "roles": {"str": "ticker", "opt": "exchange", "req": "ticker", "only_omit": "as_of"},
    },
    {
        "tool": fn("set_thermostat", {"temperature": N, "mode": S, "zone": I},
                   ["temperature", "mode"]),
        "gt": {"temperature": [21.5], "mode": ["heat"], "zone": [2, ""]},
        "roles": {"str": "mode", "int": "zone", "opt": "zone", "req": "temperature",
                  "frac": "temperature"},
    },
    {
        "tool": fn("create_event", {
            "title": S,
            "attendees": {"type": "array", "items": {"type": "object", "properties": {
                "name": S, "optional": B}}},
            "duration_minutes": I}, ["title", "attendees"]),
        "gt": {"title": ["Quarterly Review"],
               "attendees": [[{"name": ["Ann"], "optional": [False, ""]},
                              {"name": ["Bob"], "optional": [True]}]],
               "duration_minutes": [60, ""]},
        "roles": {"str": "title", "int": "duration_minutes", "opt": "duration_minutes",
                  "req": "title", "list": "attendees"},
    },
]


def name_of(sc: dict[str, Any]) -> str:
    return sc["tool"]["function"]["name"]


def first_value(acceptable: list[Any]) -> Any:
    return next((a for a in acceptable if a != "" or not isinstance(a, str)), None)


def concrete(value: Any) -> Any:
    """A concrete argument value from an acceptable value (possible-answer dicts resolved)."""
    if isinstance(value, dict):
        out = {}
        for k, alts in value.items():
            v = first_value(alts)
            if v is not None:
                out[k] = concrete(v)
        return out
    if isinstance(value, list):
        return [concrete(v) for v in value]
    return value


def canonical(sc: dict[str, Any], last: bool = False) -> dict[str, Any]:
    """Arguments that use the first (or last) non-empty acceptable value of every parameter."""
    args = {}
    for p, alts in sc["gt"].items():
        values = [a for a in alts if a != "" or not isinstance(a, str)]
        if values:
            args[p] = concrete(values[-1] if last else values[0])
    return args


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "arguments": args}


def shout(text: str) -> str:
    """Upper-case and punctuate with only the characters BFCL strips: still equal."""
    return " " + text.upper().replace(" ", "_ ").replace("a", "-a") + ". "


# --- simple: case types with their hand labels ----------------------------------------------
# Each returns the candidate call list, or None when the scenario lacks the role.
def simple_cases(sc: dict[str, Any]) -> list[tuple[str, bool, str, Any]]:
    n, r, base = name_of(sc), sc["roles"], canonical(sc)
    cases: list[tuple[str, bool, str, Any]] = []

    def add(case: str, expected: bool, why: str, args: dict[str, Any] | None = None,
            calls: list[dict[str, Any]] | None = None) -> None:
        cases.append((case, expected, why, calls if calls is not None else [call(n, args)]))

    def mut(**changes: Any) -> dict[str, Any]:
        args = copy.deepcopy(base)
        for k, v in changes.items():
            if v is _DROP:
                args.pop(k, None)
            else:
                args[k] = v
        return args

    add("canonical", True, "every parameter takes an acceptable value", base)
    if canonical(sc, last=True) != base:
        add("alternative_values", True, "the last acceptable value of each parameter is also "
            "acceptable", canonical(sc, last=True))
    add("json_string_arguments", True, "OpenAI-style arguments as a JSON string decode to the "
        "same call", calls=[{"name": n, "arguments": json.dumps(base)}])
    if "str" in r:
        p = r["str"]
        add("string_case_and_punctuation", True, "strings compare lower-cased with spaces and "
            ", . / - _ * ^ removed", mut(**{p: shout(base[p])}))
        add("string_different_word", False, "a different word survives normalization",
            mut(**{p: base[p] + " Heights"}))
        add("string_for_string_wrong_type", False, "a list where a string is expected",
            mut(**{p: [base[p]]}))
    if "num" in r:
        p = r["num"]
        add("int_for_number", True, "an int is accepted where a number is expected",
            mut(**{p: int(base[p])}))
        add("float_for_number_integral", True, "a float equal to the integral answer",
            mut(**{p: float(base[p])}))
        add("string_for_number", False, "a numeric string is not a number",
            mut(**{p: str(base[p])}))
        add("bool_for_number", False, "bools are never numbers", mut(**{p: True}))
    if "frac" in r:
        p = r["frac"]
        add("number_truncated", False, "21 is not 21.5", mut(**{p: int(base[p])}))
        add("number_exact", True, "the exact float", mut(**{p: base[p]}))
    if "int" in r:
        p = r["int"]
        add("float_for_integer", False, "a float is not accepted where an integer is expected "
            "(not even an integral one)", mut(**{p: float(base[p])}))
        add("bool_for_integer", False, "bools are never ints", mut(**{p: True}))
        add("integer_off_by_one", False, "a different integer", mut(**{p: base[p] + 1}))
        add("string_for_integer", False, "a numeric string is not an integer",
            mut(**{p: str(base[p])}))
    if "bool" in r:
        p = r["bool"]
        add("int_for_bool", False, "ints are never bools",
            mut(**{p: 1 if base[p] else 0}))
        add("bool_flipped", False, "the other bool", mut(**{p: not base[p]}))
        add("string_for_bool", False, "'true' is a string", mut(**{p: str(base[p]).lower()}))
    if "opt" in r:
        p = r["opt"]
        add("omit_optional", True, "a parameter whose answers include \"\" may be omitted",
            mut(**{p: _DROP}))
    if "opt" in r and sc["tool"]["function"]["parameters"]["properties"][r["opt"]] == S:
        add("empty_string_for_optional", True, "\"\" is itself among the acceptable values of "
            "the optional string", mut(**{r["opt"]: ""}))
    if "nonopt" in r:
        add("omit_non_optional", False, "the answers of this parameter do not include \"\" "
            "(though the schema does not require it)", mut(**{r["nonopt"]: _DROP}))
    if "req" in r:
        add("omit_required", False, "the schema requires this parameter",
            mut(**{r["req"]: _DROP}))
    if "only_omit" in r:
        add("value_for_omit_only", False, "the only acceptable value is omission",
            mut(**{r["only_omit"]: "2024-01-01"}))
    if "schema_only" in r:
        add("param_not_in_answer", False, "in the schema but not in the possible answer",
            mut(**{r["schema_only"]: "en"}))
    if "list" in r:
        p = r["list"]
        add("list_reversed", False, "lists are order-sensitive", mut(**{p: base[p][::-1]}))
        add("list_shorter", False, "a list missing its last element", mut(**{p: base[p][:-1]}))
        add("list_longer", False, "a list with an extra element",
            mut(**{p: base[p] + [base[p][0]]}))
    if "strlist" in r and "dict" not in r:
        p = r["strlist"]
        add("list_string_normalized", True, "strings inside lists are normalized too",
            mut(**{p: [s.upper() for s in base[p]]}))
    if "dict" in r:
        p, dr = r["dict"], sc["dict_roles"]
        d = base[p]
        add("dict_key_order", True, "dicts compare key by key; order is irrelevant",
            mut(**{p: dict(reversed(list(d.items())))}))
        add("dict_extra_key", False, "an unexpected key in the dict",
            mut(**{p: {**d, "breakfast": True}}))
        add("dict_missing_key", False, "a dict key without \"\" among its answers is missing",
            mut(**{p: {k: v for k, v in d.items() if k != dr["nonopt"]}}))
        add("dict_omit_optional_key", True, "a dict key whose answers include \"\" may be "
            "omitted", mut(**{p: {k: v for k, v in d.items() if k != dr["opt"]}}))
        add("dict_int_for_number", True, "int for number inside a dict",
            mut(**{p: {**d, dr["num"]: int(d[dr["num"]])}}))
        add("dict_float_for_number", True, "a float equal to the integral answer, inside a dict",
            mut(**{p: {**d, dr["num"]: float(d[dr["num"]])}}))
        add("dict_float_for_integer", True, "BFCL compares dict values by equality, untyped: "
            "a float equal to an integer answer passes even where the schema says integer",
            mut(**{p: {**d, dr["int"]: float(d[dr["int"]])}}))
        add("dict_wrong_value", False, "a different number inside the dict",
            mut(**{p: {**d, dr["num"]: d[dr["num"]] + 1}}))
        add("dict_nested_list_normalized", False, "BFCL normalizes strings directly under a "
            "dict key only: a list in a dict compares as is",
            mut(**{p: {**d, dr["strlist"]: [f"{s.upper()}-" for s in d[dr["strlist"]]]}}))
        add("dict_nested_list_exact", True, "a list in a dict equal to its answer",
            mut(**{p: {**d, dr["strlist"]: list(d[dr["strlist"]])}}))
        add("dict_nested_list_reversed", False, "a list in a dict is order-sensitive",
            mut(**{p: {**d, dr["strlist"]: d[dr["strlist"]][::-1]}}))
        add("dict_as_list", False, "a list where an object is expected",
            mut(**{p: list(d.values())}))
    add("extra_unknown_param", False, "a parameter the tool does not have",
        mut(verbose=True))
    add("wrong_function_name", False, "the function name must match exactly",
        calls=[call(n + "_v2", base)])
    add("function_name_case", False, "function names are not normalized",
        calls=[call(n.upper(), base)])
    add("two_calls", False, "simple expects exactly one call",
        calls=[call(n, base), call(n, base)])
    add("no_call", False, "simple expects exactly one call", calls=[])
    return cases


class _Drop:
    pass


_DROP = _Drop()


def main() -> None:
    out: list[dict[str, Any]] = []

    def emit(category: str, tools: list[dict[str, Any]], gt: list[dict[str, Any]], case: str,
             expected: bool, why: str, candidate: list[dict[str, Any]]) -> None:
        out.append({"id": f"{category}_{len(out):03d}_{case}", "category": category,
                    "tools": tools, "ground_truth": gt, "candidate": candidate,
                    "expected": expected, "case": case, "why": why})

    # simple
    for sc in SCENARIOS:
        for case, expected, why, cand in simple_cases(sc):
            emit("simple", [sc["tool"]], [{name_of(sc): sc["gt"]}], case, expected, why, cand)

    # multiple: one call expected among several offered tools
    for i, sc in enumerate(SCENARIOS):
        others = [SCENARIOS[(i + k) % len(SCENARIOS)] for k in (1, 2, 3)]
        tools = [o["tool"] for o in others[:2]] + [sc["tool"]] + [others[2]["tool"]]
        gt = [{name_of(sc): sc["gt"]}]
        n, base, r = name_of(sc), canonical(sc), sc["roles"]
        emit("multiple", tools, gt, "right_function", True, "the expected function, acceptable "
             "values", [call(n, base)])
        emit("multiple", tools, gt, "other_offered_function", False, "another offered tool is "
             "the wrong choice", [call(name_of(others[0]), canonical(others[0]))])
        emit("multiple", tools, gt, "right_plus_other", False, "multiple expects exactly one "
             "call", [call(n, base), call(name_of(others[1]), canonical(others[1]))])
        emit("multiple", tools, gt, "right_twice", False, "multiple expects exactly one call",
             [call(n, base), call(n, base)])
        if "str" in r:
            emit("multiple", tools, gt, "string_normalized", True, "string normalization",
                 [call(n, {**base, r["str"]: shout(base[r["str"]])})])
        if "opt" in r:
            emit("multiple", tools, gt, "omit_optional", True, "optional parameter omitted",
                 [call(n, {k: v for k, v in base.items() if k != r["opt"]})])
        if "int" in r:
            emit("multiple", tools, gt, "float_for_integer", False, "float for an integer",
                 [call(n, {**base, r["int"]: float(base[r["int"]])})])

    # parallel: several calls of one function, any order, exact count
    parallel_groups = [
        ("get_weather", "city", ["Boston", "Chicago", "Denver"]),
        ("convert_currency", "to_currency", ["EUR", "JPY", "GBP"]),
        ("get_stock_price", "ticker", ["AAPL", "MSFT"]),
        ("set_thermostat", "mode", ["heat", "cool", "auto"]),
        ("send_email", "to", ["alice@example.com", "dave@example.com"]),
        ("calculate_triangle_area", "unit", ["cm", "inches"]),
    ]
    by_name = {name_of(sc): sc for sc in SCENARIOS}
    for fname, key, values in parallel_groups:
        sc = by_name[fname]
        tools = [sc["tool"]]
        gt = [{fname: {**sc["gt"], key: [v]}} for v in values]
        calls = [call(fname, {**canonical(sc), key: v}) for v in values]
        k = len(calls)
        emit("parallel", tools, gt, "same_order", True, "all calls, in order", calls)
        emit("parallel", tools, gt, "reversed_order", True, "parallel accepts any order",
             calls[::-1])
        emit("parallel", tools, gt, "rotated_order", True, "parallel accepts any order",
             calls[1:] + calls[:1])
        emit("parallel", tools, gt, "one_missing", False, "exactly the expected count",
             calls[:-1])
        emit("parallel", tools, gt, "one_extra", False, "exactly the expected count",
             [*calls, calls[0]])
        emit("parallel", tools, gt, "duplicate_instead_of_one", False, "right count, but one "
             "expected call is never made", [*calls[:-1], calls[0]])
        wrong = copy.deepcopy(calls)
        wrong[-1]["arguments"][key] = "Atlantis"
        emit("parallel", tools, gt, "one_wrong_value", False, "one call has a value no "
             "expected call accepts", wrong)
        norm = copy.deepcopy(calls)
        norm[0]["arguments"][key] = shout(values[0])
        emit("parallel", tools, gt, "one_normalized_string", True, "string normalization in "
             "one call", norm[::-1])
        if k >= 2:
            emit("parallel", tools, gt, "single_call", False, "one call where several are "
                 "expected", calls[:1])

    # parallel_multiple: calls of different functions, any order, exact count
    pm_groups = [
        ["get_weather", "convert_currency"],
        ["book_flight", "search_hotels", "send_email"],
        ["sort_numbers", "calculate_triangle_area"],
        ["set_thermostat", "get_stock_price", "create_event"],
        ["send_email", "get_weather"],
        ["create_event", "book_flight"],
    ]
    for names in pm_groups:
        scs = [by_name[x] for x in names]
        tools = [sc["tool"] for sc in scs]
        gt = [{name_of(sc): sc["gt"]} for sc in scs]
        calls = [call(name_of(sc), canonical(sc)) for sc in scs]
        emit("parallel_multiple", tools, gt, "same_order", True, "all calls, in order", calls)
        emit("parallel_multiple", tools, gt, "reversed_order", True, "any order", calls[::-1])
        emit("parallel_multiple", tools, gt, "one_missing", False, "exact count", calls[1:])
        emit("parallel_multiple", tools, gt, "one_extra", False, "exact count",
             [*calls, calls[-1]])
        swapped = copy.deepcopy(calls)
        swapped[0]["name"] = name_of(scs[1])
        emit("parallel_multiple", tools, gt, "wrong_function", False, "one call names the "
             "wrong function", swapped)
        extra = copy.deepcopy(calls)
        extra[-1]["arguments"]["verbose"] = True
        emit("parallel_multiple", tools, gt, "unknown_param", False, "one call has an unknown "
             "parameter", extra[::-1])
        opt = [sc for sc in scs if "opt" in sc["roles"]]
        if opt:
            j = scs.index(opt[0])
            omitted = copy.deepcopy(calls)
            omitted[j]["arguments"].pop(opt[0]["roles"]["opt"], None)
            emit("parallel_multiple", tools, gt, "omit_optional", True, "optional parameter "
                 "omitted in one call", omitted[::-1])

    # irrelevance: no offered tool fits, so no call is the right answer
    for i in range(0, len(SCENARIOS), 2):
        scs = SCENARIOS[i:i + 2]
        tools = [sc["tool"] for sc in scs]
        emit("irrelevance", tools, [], "no_call", True, "no call is the expected answer", [])
        emit("irrelevance", tools, [], "one_call", False, "any call fails irrelevance",
             [call(name_of(scs[0]), canonical(scs[0]))])
        emit("irrelevance", tools, [], "two_calls", False, "any call fails irrelevance",
             [call(name_of(sc), canonical(sc)) for sc in scs])
        emit("irrelevance", tools, [], "unknown_tool_call", False, "a call to a tool that "
             "is not offered is still a call", [call("search_web", {"query": "weather"})])
        emit("irrelevance", tools, [], "empty_arguments_call", False, "a call without "
             "arguments is still a call", [call(name_of(scs[-1]), {})])

    path = Path(__file__).with_name("score_calls_cases.jsonl")
    with path.open("w", encoding="utf-8") as f:
        for row in out:
            f.write(json.dumps(row) + "\n")
    counts: dict[str, int] = {}
    for row in out:
        counts[row["category"]] = counts.get(row["category"], 0) + 1
    print(f"wrote {len(out)} cases to {path}: {counts}")


if __name__ == "__main__":
    main()
