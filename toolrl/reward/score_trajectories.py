"""``toolrl score``: score saved trajectories offline with any reward set.

Input: JSONL files of `Trajectory` records, as a run's ``rollouts/step_<N>.jsonl`` and
``toolrl eval --save-transcripts`` write them (``Trajectory.to_dict()`` plus the ``reward`` the
run gave it). Each line is scored with a reward section (``{"rewards": [...]}``, as in a config)
through the training code path (`toolrl.reward.compose`); rows of an env with its own section
(``per_env``, a config's ``env_rewards``) are scored with that one. Output lines: ``id``,
``uid``, ``score`` (the total), ``components`` (raw score per component), ``errors`` (the
failures' messages) and ``saved_reward`` (what the file said, None when absent).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from toolrl.core.jsonl import json_objects
from toolrl.core.registration import env_of
from toolrl.core.trajectory import Trajectory
from toolrl.reward.compose import RewardSection, build_reward

__all__ = ["ScoreSummary", "read_trajectories", "score_trajectories", "summary_table"]


def read_trajectories(paths: Sequence[str | os.PathLike]
                      ) -> list[tuple[Trajectory, float | None]]:
    """``(trajectory, saved reward)`` per line of the files; errors name the file and line."""
    out = []
    for path in paths:
        for lineno, data in json_objects(path, "a JSON object (a trajectory)"):
            saved = data.pop("reward", None)
            try:
                traj = Trajectory.from_dict(data)
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(f"{path}:{lineno}: not a trajectory: {exc}") from None
            out.append((traj, None if saved is None else float(saved)))
    if not out:
        raise ValueError(f"no trajectories in {', '.join(map(str, paths))}")
    return out


@dataclass
class ScoreSummary:
    """Means over the scored trajectories: total, each component, failures per component."""

    n: int
    total: float
    saved: float | None  # mean of the saved rewards (None when no line had one)
    components: dict[str, float] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    by_finish: dict[str, tuple[int, float]] = field(default_factory=dict)  # reason -> (n, total)


def score_trajectories(items: Sequence[tuple[Trajectory, float | None]],
                       reward: RewardSection | Mapping[str, Any] | Sequence[Any],
                       output: str | os.PathLike | None = None, *,
                       per_env: Mapping[str, Any] | None = None,
                       default_env: str | None = None) -> ScoreSummary:
    """Score ``items`` with the ``reward`` section (``per_env`` sections for rows of those envs,
    a row's env being its ``env`` field or ``default_env``); write one line per trajectory to
    ``output`` when given."""
    per_env = dict(per_env or {})
    groups: dict[str | None, list[int]] = {}
    for i, (traj, _) in enumerate(items):
        env = env_of(traj.row, default_env)
        groups.setdefault(env if env in per_env else None, []).append(i)
    lines: list[dict[str, Any]] = [{} for _ in items]
    components: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    for env, indices in groups.items():
        prefix = "" if env is None else f"{env}/"
        with build_reward(reward if env is None else per_env[env]) as fn:
            batch = fn.score([items[i][0] for i in indices])
        failed: dict[int, list[str]] = {}
        for failure in batch.failures:
            failed.setdefault(failure.index, []).append(f"{failure.reward}: {failure.message}")
        for k, i in enumerate(indices):
            traj, saved = items[i]
            comps = {prefix + a: v[k] for a, v in batch.components.items() if v[k] is not None}
            lines[i] = {"id": traj.id, "uid": traj.uid, "score": batch.scores[k],
                        "components": comps, "errors": failed.get(k, []),
                        "saved_reward": saved}
        for alias, values in batch.components.items():
            components.setdefault(prefix + alias, []).extend(v for v in values if v is not None)
        for alias, count in batch.errors.items():
            errors[prefix + alias] = errors.get(prefix + alias, 0) + count
    if output is not None:
        with open(output, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    saved = [s for _, s in items if s is not None]
    by_finish: dict[str, list[float]] = {}
    for (traj, _), line in zip(items, lines, strict=True):
        by_finish.setdefault(traj.finish_reason, []).append(line["score"])
    return ScoreSummary(
        n=len(items), total=sum(line["score"] for line in lines) / len(lines),
        saved=sum(saved) / len(saved) if saved else None,
        components={k: sum(v) / len(v) for k, v in components.items() if v}, errors=errors,
        by_finish={k: (len(v), sum(v) / len(v)) for k, v in sorted(by_finish.items())})


def summary_table(summary: ScoreSummary, title: str = "score") -> Any:
    """A rich Table: each component's mean and failures, the total, the saved reward, and the
    total per finish reason."""
    table = Table(title=f"{title} ({summary.n} trajectories)")
    table.add_column("what")
    table.add_column("mean", justify="right")
    table.add_column("errors", justify="right")
    for alias, mean in summary.components.items():
        table.add_row(alias, f"{mean:.4f}", str(summary.errors.get(alias, "")))
    table.add_row("total", f"{summary.total:.4f}", str(sum(summary.errors.values())))
    if summary.saved is not None:
        table.add_row("saved reward (in the file)", f"{summary.saved:.4f}", "")
    for reason, (n, mean) in summary.by_finish.items():
        table.add_row(f"total, finish {reason} (n={n})", f"{mean:.4f}", "")
    return table
