"""`tau2`: tau2-bench's own reward for a toolrl/Tau2-v0 episode, with its per-check parts.

The env scores the episode with tau2's ``evaluate_simulation`` when it ends; this plugin reads
that score (``info["tau2"]["reward"]``) and returns tau2's ``reward_breakdown`` (DB,
ENV_ASSERTION, ACTION, COMMUNICATE, as the task's reward basis has them) as components, so the
metrics show which check fails. An episode the rollout cut before the env ended it gets
0.0, as tau2 scores an unfinished simulation.
"""

from __future__ import annotations

from toolrl import RewardResult, Trajectory, reward


@reward("tau2")
def tau2(traj: Trajectory) -> RewardResult:
    """tau2's reward (0.0 or 1.0) with its per-check breakdown as components."""
    info = traj.info.get("tau2")
    if info is None:
        if "domain" not in traj.row:
            raise ValueError("neither a 'tau2' info nor a tau2 row: the tau2 reward needs "
                             "toolrl/Tau2-v0")
        # the rollout cut the episode (its turn or token cap) before the env ended it: tau2
        # scores an unfinished simulation (max_steps) 0.0
        return RewardResult(score=0.0, reason=f"cut before tau2 scored it: "
                                              f"{traj.finish_reason}")
    components = {key.lower(): float(value)
                  for key, value in (info.get("reward_breakdown") or {}).items()}
    reason = info.get("error") or ("" if info.get("reward") == 1.0 else
                                   f"termination: {info.get('termination_reason')}")
    return RewardResult(score=float(info.get("reward") or 0.0), components=components,
                        reason=reason)
