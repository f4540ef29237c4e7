"""`format`: a well-formed call where one is expected: each turn's tool calls are well-formed in
the env's format, to known tools, and an episode that never calls a tool scores ``no_call_score``
when its task expects a call."""

from __future__ import annotations

from toolrl import RewardResult, Trajectory, reward


@reward("format")
class FormatReward:
    """Well-formed tool calls per turn, to known tools, without json repair (in [0, 1]).

    Per turn ``1 - penalties`` (floored at 0): ``parse_error_penalty`` when the turn has a
    malformed call, ``unknown_tool_penalty`` when it calls a tool the episode does not offer,
    ``repair_penalty`` when a json-repair fallback was needed. The episode's score is the
    ``mean`` (or ``min``) over assistant turns; 0 when there is none. Per-turn scores included.

    An answer in prose is a well-formed turn but no call: an episode without any call (and
    without a malformed one) scores ``no_call_score`` (0) when its task expects a call, i.e.
    when the row's ``ground_truth`` is a non-empty list of calls (BFCL's possible answers) or,
    for rows without such a list, when the episode offered tools. A row whose ground truth is
    an empty list (BFCL's irrelevance: no function fits) expects no call, and a prose answer
    scores 1. Gate it on correctness (``gate: {reward: bfcl_ast}``) so format alone does not
    pay.
    """

    def __init__(self, parse_error_penalty: float = 1.0, unknown_tool_penalty: float = 1.0,
                 repair_penalty: float = 0.5, reduce: str = "mean",
                 no_call_score: float = 0.0) -> None:
        if reduce not in ("mean", "min"):
            raise ValueError(f"format: reduce must be 'mean' or 'min', got {reduce!r}")
        for name, value in (("parse_error_penalty", parse_error_penalty),
                            ("unknown_tool_penalty", unknown_tool_penalty),
                            ("repair_penalty", repair_penalty),
                            ("no_call_score", no_call_score)):
            if not 0 <= value <= 1:
                raise ValueError(f"format: {name} must be in [0, 1], got {value!r}")
        self.parse_error_penalty = parse_error_penalty
        self.unknown_tool_penalty = unknown_tool_penalty
        self.repair_penalty = repair_penalty
        self.reduce = reduce
        self.no_call_score = no_call_score

    def __call__(self, traj: Trajectory) -> RewardResult:
        known = traj.tool_names() if traj.tools else None
        per_turn, problems = [], []
        for i, parse in enumerate(traj.parses()):
            penalty = 0.0
            if parse.errors:
                penalty += self.parse_error_penalty
                problems.append(f"turn {i}: {parse.errors[0].kind}: {parse.errors[0].message}")
            unknown = [c.name for c in parse.calls if known is not None and c.name not in known]
            if unknown:
                penalty += self.unknown_tool_penalty
                problems.append(f"turn {i}: unknown tool(s) {unknown}")
            if parse.repaired:
                penalty += self.repair_penalty
                problems.append(f"turn {i}: needed json repair")
            per_turn.append(max(0.0, 1.0 - penalty))
        if not per_turn:
            return RewardResult(0.0, per_turn=[], reason="no assistant turn")
        if not traj.calls and not problems and expects_call(traj):
            return RewardResult(self.no_call_score, per_turn=[self.no_call_score] * len(per_turn),
                                reason="no tool call where the task expects one")
        score = min(per_turn) if self.reduce == "min" else sum(per_turn) / len(per_turn)
        return RewardResult(score, per_turn=per_turn, reason="; ".join(problems))


def expects_call(traj: Trajectory) -> bool:
    """Whether ``traj``'s task expects a tool call: a ground truth that is a list of calls says
    so (empty: no call fits); otherwise, whether the episode offered tools."""
    truth = traj.row.get("ground_truth")
    if isinstance(truth, list):
        return bool(truth)
    return bool(traj.tools)
