"""`exec_state`: the env's final state equals the task's expected state (Bank-v0, HttpApi-v0)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from toolrl import RewardResult, Trajectory, reward


@reward("exec_state")
def exec_state(traj: Trajectory, *, keys: Sequence[str] | None = None, ignore: Sequence[str] = (),
               abs_tol: float = 1e-9, partial: bool = False) -> RewardResult:
    """Compare ``final_state`` with ``row["expected_state"]`` deeply (numbers within ``abs_tol``).

    ``keys`` restricts the comparison to those top-level keys, ``ignore`` drops some. With
    ``partial`` the score is the fraction of top-level keys that match; otherwise 1.0 or 0.0.
    """
    if "expected_state" not in traj.row:
        raise ValueError("task row has no 'expected_state'")
    if traj.final_state is None:
        raise ValueError("trajectory has no final_state (env.state_snapshot())")
    expected, actual = traj.row["expected_state"], traj.final_state
    if not isinstance(expected, Mapping) or not isinstance(actual, Mapping):
        diff = _diff(actual, expected, "state", abs_tol)
        return RewardResult(0.0 if diff else 1.0, reason=diff)
    names = list(keys) if keys is not None else sorted(set(expected) | set(actual), key=str)
    names = [k for k in names if k not in set(ignore)]
    diffs = {}
    for k in names:
        if k not in expected or k not in actual:
            diffs[k] = f"state.{k}: {'missing' if k not in actual else 'unexpected'}"
            continue
        d = _diff(actual[k], expected[k], f"state.{k}", abs_tol)
        if d:
            diffs[k] = d
    reason = "; ".join(diffs.values())
    if partial:
        score = 1.0 - len(diffs) / len(names) if names else 1.0
        return RewardResult(score, reason=reason)
    return RewardResult(0.0 if diffs else 1.0, reason=reason)


def _diff(actual: Any, expected: Any, path: str, tol: float) -> str:
    """The first difference between two JSON-like values, or ""."""
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            return f"{path}: expected an object, got {actual!r}"
        if set(actual) != set(expected):
            missing = sorted(set(expected) - set(actual), key=str)
            extra = sorted(set(actual) - set(expected), key=str)
            return f"{path}: keys differ (missing {missing}, unexpected {extra})"
        for k in expected:
            d = _diff(actual[k], expected[k], f"{path}.{k}", tol)
            if d:
                return d
        return ""
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"{path}: expected {expected!r}, got {actual!r}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            d = _diff(a, e, f"{path}[{i}]", tol)
            if d:
                return d
        return ""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return "" if type(actual) is type(expected) and actual == expected else \
            f"{path}: expected {expected!r}, got {actual!r}"
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        ok = math.isclose(actual, expected, rel_tol=0.0, abs_tol=tol)
        return "" if ok else f"{path}: expected {expected!r}, got {actual!r}"
    return "" if actual == expected else f"{path}: expected {expected!r}, got {actual!r}"
