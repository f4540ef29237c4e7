"""`answer_match`: the episode's final answer equals the task's ``answer`` (numbers within a
tolerance), e.g. Calculator-v0."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from toolrl import RewardResult, Trajectory, reward

_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


@reward("answer_match")
def answer_match(traj: Trajectory, *, rel_tol: float = 1e-6, abs_tol: float = 1e-6,
                 submit_tools: Sequence[str] = ("submit", "final_answer"),
                 from_text: bool = True) -> RewardResult:
    """1.0 when the submitted answer matches the task's answer, else 0.0.

    The expected answer is ``row["answer"]``, else ``row["ground_truth"]`` (Calculator-v0).
    The submitted one is the last call to one of ``submit_tools`` (its ``answer`` argument, or
    its only argument); without one, and with ``from_text``, the last assistant message (its
    last number when the expected answer is numeric). Numbers match within ``rel_tol`` /
    ``abs_tol``; other answers after trimming, lower-casing and collapsing whitespace.
    """
    key = "answer" if "answer" in traj.row else "ground_truth"
    if key not in traj.row:
        raise ValueError("task row has neither 'answer' nor 'ground_truth'")
    expected = traj.row[key]
    found, predicted = _submitted(traj, submit_tools)
    if not found and from_text:
        found, predicted = _from_text(traj, numeric=_as_number(expected) is not None)
    if not found:
        return RewardResult(0.0, reason="no answer submitted")
    exp_num, pred_num = _as_number(expected), _as_number(predicted)
    if exp_num is not None:
        ok = pred_num is not None and math.isclose(pred_num, exp_num, rel_tol=rel_tol,
                                                   abs_tol=abs_tol)
    else:
        ok = _norm(predicted) == _norm(expected)
    return RewardResult(1.0 if ok else 0.0,
                        reason="" if ok else f"answer {predicted!r} != expected {expected!r}")


def _submitted(traj: Trajectory, tools: Sequence[str]) -> tuple[bool, Any]:
    for call in reversed(traj.calls):
        if call.name in tools:
            args = call.arguments if isinstance(call.arguments, dict) else {}
            if "answer" in args:
                return True, args["answer"]
            if len(args) == 1:
                return True, next(iter(args.values()))
            return True, None
    return False, None


def _from_text(traj: Trajectory, numeric: bool) -> tuple[bool, Any]:
    for msg in reversed(traj.messages):
        if msg.get("role") != "assistant":
            continue
        text = msg.get("content") or ""
        if not isinstance(text, str) or not text.strip():
            return False, None
        if numeric:
            numbers = _NUMBER.findall(text)
            return (True, numbers[-1]) if numbers else (False, None)
        return True, text
    return False, None


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            number = float(value.strip().replace(",", ""))
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def _norm(value: Any) -> str:
    return " ".join(str(value).strip().lower().split())
