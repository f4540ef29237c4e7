"""Scores the way BFCL reports them: the leaderboard's summary averages over per-category
accuracies (`toolrl eval`; offline scoring of candidate calls is `toolrl.reward.score_calls`).

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
