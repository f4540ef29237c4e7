"""`bfcl_ast`: 1.0 when the calls pass BFCL's AST checker, else 0.0 with BFCL's reason."""

from __future__ import annotations

from toolrl.core.bfcl import check_parsed
from toolrl.core.reward import RewardResult, Trajectory, reward


@reward("bfcl_ast")
def bfcl_ast(traj: Trajectory, *, strict_parse: bool = True) -> RewardResult:
    """Binary exact match of every call of the episode against BFCL possible answers.

    The task row needs ``ground_truth`` (possible-answer format) and may give ``category``
    (toolrl's simple, multiple, parallel, parallel_multiple, irrelevance, relevance, or a BFCL
    single-turn name such as ``live_multiple``; inferred when absent). Types come from the row's
    own ``tools`` (BFCL's type names, checked exactly), else the episode's. With
    ``strict_parse`` the output decodes all or nothing, as in BFCL: a malformed tool call fails,
    except under ``irrelevance``, where output that does not decode is no call.
    """
    if "ground_truth" not in traj.row:
        raise ValueError("task row has no 'ground_truth' (BFCL possible answers)")
    verdict = check_parsed(traj.parses(), traj.row["ground_truth"], traj.row.get("category"),
                           traj.row.get("tools") or traj.tools, strict_parse=strict_parse)
    return RewardResult(1.0 if verdict.valid else 0.0, reason=verdict.error)
