"""An example reward plugin: a bonus for keywords in the final assistant message."""

from __future__ import annotations

from collections.abc import Sequence

from toolrl import RewardResult, Trajectory, reward


@reward("keyword_bonus")
def keyword_bonus(traj: Trajectory, *, keywords: Sequence[str] = ("thanks",),
                  bonus: float = 0.1) -> RewardResult:
    """``bonus`` per keyword found (case-insensitive) in the last assistant message."""
    last = next((m.get("content") or "" for m in reversed(traj.messages)
                 if m.get("role") == "assistant"), "")
    found = [k for k in keywords if k.lower() in str(last).lower()]
    return RewardResult(bonus * len(found), components={"found": float(len(found))},
                        reason="" if found else "no keyword")
