"""`success`: 1.0 when the environment reported ``info["success"]``, else 0.0."""

from __future__ import annotations

from toolrl import Trajectory, reward


@reward("success")
def success(traj: Trajectory) -> float:
    """The env's own outcome judgement, ``info["success"]``, as 1.0 / 0.0."""
    if "success" not in traj.info:
        raise ValueError("env info has no 'success' key; this env does not define an outcome")
    return 1.0 if traj.info["success"] else 0.0
