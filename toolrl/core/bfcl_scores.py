"""Scores the way BFCL reports them: offline scoring of candidate calls (`toolrl score-calls`)
and the leaderboard's summary averages over per-category accuracies (`toolrl eval`).

`leaderboard` is a port of BFCL's ``generate_leaderboard_csv`` for the columns single-turn
results feed: non-live (Simple AST is the plain mean of Python, Java and JavaScript simple; the
AST summary and overall the plain mean of simple, multiple, parallel and parallel multiple),
live (the mean weighted by entries of the four live AST categories), irrelevance (the plain mean
of non-live and live irrelevance), relevance (live relevance) and the overall accuracy
(10% non-live, 10% live, 10% irrelevance, 30% multi-turn, 40% agentic). As in BFCL, a category
that was not evaluated counts as 0 (with its full BFCL v4 size where entries weigh) and makes a
summary that contains it display ``"N/A"``; the overall columns never display N/A.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolrl.core.bfcl import as_tool_call
from toolrl.core.types import ParseError, ParseResult

# --- BFCL's leaderboard ----------------------------------------------------------------------
LIVE_AST_SIZES = {"live_simple": 258, "live_multiple": 1053, "live_parallel": 16,
                  "live_parallel_multiple": 24}
"""Entries of BFCL v4's live AST categories (the live average is weighted by entries)."""

NA = "N/A"


@dataclass(frozen=True)
class _Score:
    accuracy: float
    total_count: int
    display: float | str


def _unweighted(scores: Sequence[_Score], na: bool = True) -> _Score:
    acc = sum(s.accuracy for s in scores) / len(scores)
    missing = any(s.display == NA for s in scores)
    return _Score(acc, sum(s.total_count for s in scores), NA if na and missing else acc)


def _weighted(scores: Sequence[_Score], na: bool = True) -> _Score:
    total = sum(s.total_count for s in scores)
    acc = sum(s.accuracy * s.total_count for s in scores) / total if total else 0.0
    missing = any(s.display == NA for s in scores)
    return _Score(acc, total, NA if na and missing else acc)


def _percentage_weighted(scores: Sequence[_Score], weights: Sequence[float]) -> _Score:
    acc = sum(s.accuracy * w for s, w in zip(scores, weights, strict=True)) / sum(weights)
    return _Score(acc, sum(s.total_count for s in scores), acc)


def leaderboard(per_category: Mapping[str, tuple[int, int]]) -> dict[str, Any]:
    """BFCL's summary columns from ``{category: (correct, total)}`` (BFCL category names).

    Returns ``{"non_live": {column: value}, "live": {...}, "overall": {...}, "missing": [...]}``
    where a value is an accuracy in [0, 1] or ``"N/A"``; column names are BFCL's CSV headers.
    """
    def get(category: str) -> _Score:
        if category in per_category and per_category[category][1] > 0:
            correct, total = per_category[category]
            return _Score(correct / total, total, correct / total)
        return _Score(0.0, LIVE_AST_SIZES.get(category, 0), NA)

    simple_py, java, js = get("simple_python"), get("simple_java"), get("simple_javascript")
    multiple, parallel, par_mult = get("multiple"), get("parallel"), get("parallel_multiple")
    irrelevance = get("irrelevance")
    simple = _unweighted([simple_py, java, js])
    non_live_ast = [simple, multiple, parallel, par_mult]
    non_live_summary = _unweighted(non_live_ast)
    non_live_overall = _unweighted(non_live_ast, na=False)
    live_ast = [get(c) for c in LIVE_AST_SIZES]
    live_summary = _weighted(live_ast)
    live_overall = _weighted(live_ast, na=False)
    live_irrelevance, live_relevance = get("live_irrelevance"), get("live_relevance")
    multi_turn = _unweighted([get(c) for c in ("multi_turn_base", "multi_turn_miss_func",
                                               "multi_turn_miss_param",
                                               "multi_turn_long_context")], na=False)
    web_search = _unweighted([get("web_search_base"), get("web_search_no_snippet")])
    memory = _unweighted([get("memory_kv"), get("memory_vector"), get("memory_rec_sum")])
    agentic = _unweighted([web_search, memory], na=False)
    total_irrelevance = _unweighted([irrelevance, live_irrelevance])
    overall = _percentage_weighted(
        [non_live_overall, live_overall, total_irrelevance, multi_turn, agentic],
        [10, 10, 10, 30, 40])
    known = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
             "parallel_multiple", "irrelevance", *LIVE_AST_SIZES, "live_irrelevance",
             "live_relevance")
    return {
        "non_live": {
            "Non-Live Overall Acc": non_live_overall.display,
            "AST Summary": non_live_summary.display, "Simple AST": simple.display,
            "Python Simple AST": simple_py.display, "Java Simple AST": java.display,
            "JavaScript Simple AST": js.display, "Multiple AST": multiple.display,
            "Parallel AST": parallel.display, "Parallel Multiple AST": par_mult.display,
            "Irrelevance Detection": irrelevance.display,
        },
        "live": {
            "Live Overall Acc": live_overall.display, "AST Summary": live_summary.display,
            "Python Simple AST": live_ast[0].display, "Python Multiple AST": live_ast[1].display,
            "Python Parallel AST": live_ast[2].display,
            "Python Parallel Multiple AST": live_ast[3].display,
            "Irrelevance Detection": live_irrelevance.display,
            "Relevance Detection": live_relevance.display,
        },
        "overall": {
            "Overall Acc": overall.display, "Non-Live AST Acc": non_live_summary.display,
            "Live Acc": live_overall.display, "Multi Turn Acc": multi_turn.display,
            "Web Search Acc": web_search.display, "Memory Acc": memory.display,
            "Relevance Detection": live_relevance.display,
            "Irrelevance Detection": total_irrelevance.display,
        },
        "missing": [c for c in known if get(c).display == NA],
    }


def leaderboard_tables(board: Mapping[str, Any]) -> list[Any]:
    """rich Tables of a `leaderboard` result (percentages, as BFCL's CSV files write them)."""
    from rich.table import Table

    tables = []
    for key, title in (("non_live", "BFCL non-live"), ("live", "BFCL live"),
                       ("overall", "BFCL overall (multi-turn and agentic not evaluated: 0)")):
        table = Table(title=title)
        table.add_column("column")
        table.add_column("accuracy", justify="right")
        for column, value in board[key].items():
            table.add_row(column, value if value == NA else f"{100 * value:.2f}%")
        tables.append(table)
    return tables


# --- offline scoring (`toolrl score-calls`) ----------------------------------------------------
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
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON: {exc}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: each line must be a JSON object")
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
    from toolrl.core.reward import Trajectory, build_reward

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
    from rich.table import Table

    table = Table(title=title)
    for col in ("category", "n", "accuracy", "mean score", "errors"):
        table.add_column(col, justify="left" if col == "category" else "right")
    for key, s in stats.items():
        table.add_row(key, str(s.n), f"{s.accuracy:.3f}", f"{s.mean_score:.3f}", str(s.errors))
    return table
