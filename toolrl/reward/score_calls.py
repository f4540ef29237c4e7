"""`toolrl score-calls`: score candidate tool calls offline with a registered reward, through
the same composition code path as training (one `Trajectory` per candidate)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from toolrl.core.jsonl import json_objects
from toolrl.core.trajectory import Trajectory
from toolrl.core.types import ParseError, ParseResult, as_tool_call
from toolrl.reward.compose import build_reward

_SCORE_KEYS = ("id", "category", "tools", "ground_truth", "candidate")


@dataclass(frozen=True)
class CategoryStats:
    """Per-category outcome of `score_calls`."""

    n: int
    passed: int
    mean_score: float
    errors: int  # samples on which the reward raised (scored with the fallback)

    @property
    def accuracy(self) -> float:
        return self.passed / self.n if self.n else float("nan")


def read_score_inputs(path: str) -> list[dict[str, Any]]:
    """Read and validate `score-calls` input lines; errors name the file and line."""
    rows = []
    for lineno, row in json_objects(path):
        missing = [k for k in _SCORE_KEYS if k not in row]
        if missing:
            raise ValueError(f"{path}:{lineno}: missing key(s) {', '.join(missing)} "
                             f"(each line needs {', '.join(_SCORE_KEYS)})")
        if not isinstance(row["candidate"], list):
            raise ValueError(f"{path}:{lineno}: 'candidate' must be a list of "
                             f"{{name, arguments}} calls")
        rows.append(row)
    return rows


def score_calls(reward_id: str, input_path: str, output_path: str, *,
                kwargs: Mapping[str, Any] | None = None,
                pass_threshold: float = 1.0) -> dict[str, CategoryStats]:
    """Score candidate calls offline with a registered reward (the training code path).

    Writes one ``{"id", "score", "error"}`` line per input line to ``output_path`` and returns
    per-category stats (a sample passes when its score >= ``pass_threshold``), plus ``"all"``.
    """
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ValueError(f"reward kwargs must be a JSON object, got {kwargs!r}")
    rows = read_score_inputs(input_path)
    trajs = []
    for row in rows:
        try:
            calls = [as_tool_call(c) for c in row["candidate"]]
        except ValueError:  # an undecodable candidate is scored as the model's garbage output
            calls = None
        task = {"id": row["id"], "category": row["category"], "ground_truth": row["ground_truth"]}
        traj = Trajectory.from_calls(calls or [], task, row["tools"])
        if calls is None:
            traj.turns[0].parse = ParseResult(calls=[], text="", errors=[
                ParseError("bad_arguments", "candidate calls could not be decoded")])
        trajs.append(traj)
    with build_reward({"rewards": [{"name": reward_id, "kwargs": dict(kwargs or {})}]}) as fn:
        result = fn.score(trajs)
    alias = reward_id
    failed = {f.index: f.message for f in result.failures}
    groups: dict[str, list[tuple[float, bool]]] = {}
    with open(output_path, "w", encoding="utf-8") as out:
        for i, row in enumerate(rows):
            score = result.components[alias][i]
            error = failed.get(i) or result.reasons[alias][i]
            out.write(json.dumps({"id": row["id"], "score": score, "error": error}) + "\n")
            for key in (str(row["category"]), "all"):
                groups.setdefault(key, []).append((score, i in failed))
    return {key: CategoryStats(n=len(v), passed=sum(s >= pass_threshold for s, _ in v),
                               mean_score=sum(s for s, _ in v) / len(v),
                               errors=sum(e for _, e in v))
            for key, v in sorted(groups.items(), key=lambda kv: (kv[0] == "all", kv[0]))}


def stats_table(stats: Mapping[str, CategoryStats], title: str = "score-calls") -> Any:
    """A rich Table of per-category accuracy."""
    table = Table(title=title)
    for col in ("category", "n", "accuracy", "mean score", "errors"):
        table.add_column(col, justify="left" if col == "category" else "right")
    for key, s in stats.items():
        table.add_row(key, str(s.n), f"{s.accuracy:.3f}", f"{s.mean_score:.3f}", str(s.errors))
    return table
