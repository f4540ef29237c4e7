"""`bfcl_ast`: 1.0 when the calls pass BFCL's AST checker, else 0.0 with the reason."""

from __future__ import annotations

from toolrl.core.bfcl import check_parsed
from toolrl.core.reward import RewardResult, Trajectory, reward


@reward("bfcl_ast")
def bfcl_ast(traj: Trajectory, *, strict_parse: bool = True) -> RewardResult:
    """Binary exact match of every call of the episode against BFCL possible answers.

    The task row needs ``ground_truth`` (possible-answer format) and may give ``category``
    (simple, multiple, parallel, parallel_multiple, irrelevance; inferred when absent). With
    ``strict_parse`` a malformed tool call fails the check, except under ``irrelevance``, where
    (as in BFCL) output that does not decode to a call counts as no call.
    """
    if "ground_truth" not in traj.row:
        raise ValueError("task row has no 'ground_truth' (BFCL possible answers)")
    verdict = check_parsed(traj.parses(), traj.row["ground_truth"], traj.row.get("category"),
                           traj.tools, strict_parse=strict_parse)
    return RewardResult(1.0 if verdict.valid else 0.0, reason=verdict.error)
