"""`turn_penalty`: a cost per assistant turn beyond the free ones, in [-max_penalty, 0]."""

from __future__ import annotations

from toolrl import Trajectory, reward


@reward("turn_penalty")
class TurnPenalty:
    """``-penalty`` per assistant turn after the first ``free_turns``, capped at ``max_penalty``."""

    def __init__(self, penalty: float = 0.1, free_turns: int = 1, max_penalty: float = 1.0) -> None:
        if penalty < 0 or max_penalty < 0 or free_turns < 0:
            raise ValueError("turn_penalty: penalty, free_turns and max_penalty must be >= 0")
        self.penalty, self.free_turns, self.max_penalty = penalty, free_turns, max_penalty

    def __call__(self, traj: Trajectory) -> float:
        extra = max(0, len(traj.turns) - self.free_turns)
        return -min(self.max_penalty, self.penalty * extra)
