"""`toolcall_fine`: the fine-grained tool-call reward of ToolRL (arXiv 2504.13958).

Correctness = tool-name match (frequency-aware Jaccard of the name multisets) + for each
ground-truth call, matched to the best unused predicted call with the same name: parameter-name
Jaccard + the number of parameter values that match exactly. The sum is divided by its maximum
``1 + |G| + sum_j |K_j|`` and mapped linearly to ``[low, high]`` (ToolRL: [-3, 3]). A format
score (ToolRL: {0, 1}) is added when every turn parsed cleanly.

Ground truth is in BFCL's possible-answer format. ``K_j``, the parameters a ground-truth call
expects, is its parameters that may not be omitted (no ``""`` among the acceptable values) plus
the optional ones the matched prediction gave: omitting an optional parameter costs nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from toolrl.core.bfcl import match_value, parse_ground_truth, tool_schemas
from toolrl.core.reward import RewardResult, Trajectory, reward


@reward("toolcall_fine")
class ToolCallFine:
    """ToolRL's fine-grained correctness in ``[low, high]`` plus a ``format_score`` bonus.

    ``value_match``: ``exact`` (ToolRL: equal JSON values; bools never equal numbers) or
    ``bfcl`` (the schema-typed comparison of the BFCL checker, strings normalized).
    """

    def __init__(self, low: float = -3.0, high: float = 3.0, format_score: float = 1.0,
                 value_match: str = "exact") -> None:
        if not low < high:
            raise ValueError(f"toolcall_fine: need low < high, got [{low}, {high}]")
        if value_match not in ("exact", "bfcl"):
            raise ValueError(f"toolcall_fine: value_match must be 'exact' or 'bfcl', "
                             f"got {value_match!r}")
        self.low, self.high, self.format_score = low, high, format_score
        self.value_match = value_match

    def __call__(self, traj: Trajectory) -> RewardResult:
        if "ground_truth" not in traj.row:
            raise ValueError("task row has no 'ground_truth' (BFCL possible answers)")
        expected = parse_ground_truth(traj.row["ground_truth"])
        parses = traj.parses()
        predicted = [c for p in parses for c in p.calls]
        schemas = tool_schemas(traj.row.get("tools") or traj.tools) \
            if self.value_match == "bfcl" else {}
        parts = fine_grained(predicted, expected, self.value_match, schemas)
        correct = self.low + (self.high - self.low) * parts["normalized"]
        clean = bool(parses) and all(not p.errors and not p.repaired for p in parses)
        fmt = self.format_score if clean else 0.0
        return RewardResult(correct + fmt, components={
            "correct": correct, "format": fmt, "name": parts["name"], "param": parts["param"],
            "value": parts["value"], "normalized": parts["normalized"]})


def fine_grained(predicted: list[Any], expected: list[tuple[str, dict[str, list[Any]]]],
                 value_match: str = "exact",
                 schemas: Mapping[str, dict[str, Any]] | None = None) -> dict[str, float]:
    """The ToolRL match terms: ``name``, ``param``, ``value``, ``max`` and ``normalized``."""
    schemas = schemas or {}
    g_names = Counter(name for name, _ in expected)
    p_names = Counter(c.name for c in predicted)
    union = sum((g_names | p_names).values())
    r_name = sum((g_names & p_names).values()) / union if union else 1.0
    used: set[int] = set()
    r_param = r_value = 0.0
    max_score = 1.0 + len(expected)
    for name, params in expected:
        required = {k for k, acc in params.items() if "" not in acc}
        best: tuple[float, float, int, int] | None = None  # (param, value, |K|, index)
        for j, call in enumerate(predicted):
            if j in used or call.name != name:
                continue
            args = call.arguments if isinstance(call.arguments, Mapping) else {}
            keys = required | {k for k in args if k in params}
            both = keys & set(args)
            union_keys = keys | set(args)
            jacc = len(both) / len(union_keys) if union_keys else 1.0
            props = (schemas.get(name) or {}).get("properties") or {}
            values = sum(1.0 for k in both if _value_ok(args[k], params[k], props.get(k),
                                                        value_match))
            if best is None or jacc + values > best[0] + best[1]:
                best = (jacc, values, len(keys), j)
        if best is None:
            max_score += len(required)
            continue
        used.add(best[3])
        r_param += best[0]
        r_value += best[1]
        max_score += best[2]
    total = r_name + r_param + r_value
    return {"name": r_name, "param": r_param, "value": r_value, "max": max_score,
            "normalized": total / max_score}


def _value_ok(value: Any, acceptable: list[Any], schema: Any, mode: str) -> bool:
    if mode == "bfcl":
        return not match_value(value, acceptable, schema)
    return any(exact_equal(value, a) for a in acceptable)


def exact_equal(value: Any, expected: Any) -> bool:
    """JSON equality where bools never equal numbers; a dict expected in possible-answer form
    (``{key: [acceptable]}``) is matched key by key."""
    if isinstance(expected, Mapping):
        if not isinstance(value, Mapping) or not set(value) <= set(expected):
            return False
        alts = {k: v if isinstance(v, list) else [v] for k, v in expected.items()}
        return (all(any(exact_equal(value[k], a) for a in alts[k]) for k in value)
                and all(k in value or "" in alts[k] for k in alts))
    if isinstance(expected, (list, tuple)):
        return (isinstance(value, (list, tuple)) and len(value) == len(expected)
                and all(exact_equal(v, e) for v, e in zip(value, expected, strict=True)))
    if isinstance(expected, bool) or isinstance(value, bool):
        return type(value) is type(expected) and value == expected
    if isinstance(expected, (int, float)):
        return isinstance(value, (int, float)) and value == expected
    return type(value) is type(expected) and value == expected
