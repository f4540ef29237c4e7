"""`tool_error_penalty`: a cost per tool error (validation, exception, timeout...)."""

from __future__ import annotations

from collections.abc import Sequence

from toolrl import RewardResult, Trajectory, reward


@reward("tool_error_penalty")
class ToolErrorPenalty:
    """-penalty per tool error of the episode, capped at max_penalty; per-turn scores too.

    ``types`` counts only errors whose ``type`` is listed (e.g. ``[missing_required,
    wrong_type]``); None counts every error.
    """

    def __init__(self, penalty: float = 0.25, max_penalty: float = 1.0,
                 types: Sequence[str] | None = None) -> None:
        if penalty < 0 or max_penalty < 0:
            raise ValueError("tool_error_penalty: penalty and max_penalty must be >= 0")
        self.penalty, self.max_penalty = penalty, max_penalty
        self.types = None if types is None else frozenset(types)

    def __call__(self, traj: Trajectory) -> RewardResult:
        counts = [sum(1 for e in turn.errors
                      if self.types is None or e.get("type") in self.types)
                  for turn in traj.turns]
        per_turn = [-min(self.max_penalty, self.penalty * n) for n in counts]
        total = sum(counts)
        return RewardResult(-min(self.max_penalty, self.penalty * total), per_turn=per_turn,
                            components={"count": float(total)})
