"""Scores the way BFCL reports them: the leaderboard's summary averages over per-category
accuracies (`toolrl eval`; offline scoring of candidate calls is `toolrl.reward.score_calls`).

`leaderboard` is a port of BFCL's ``generate_leaderboard_csv`` (``eval_runner_helper.py``),
its CSV files' columns under BFCL's headers: non-live (Simple AST is the plain mean of Python,
Java and JavaScript simple; the AST summary and overall the plain mean of simple, multiple,
parallel and parallel multiple), live (the mean weighted by entries of the four live AST
categories), multi-turn (the plain mean of base, miss func, miss param and long context),
agentic (the plain mean of the web-search and memory summaries), irrelevance (the plain mean
of non-live and live irrelevance), relevance (live relevance) and the overall accuracy (10%
non-live, 10% live, 10% irrelevance, 30% multi-turn, 40% agentic). As in BFCL, a category that
was not evaluated counts as 0 (with its full BFCL v4 size where entries weigh) and makes a
summary that contains it display ``"N/A"``; the overall columns never display N/A.
``not_run`` says why each category that was not evaluated was not (`NOT_RUN`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

# --- BFCL's leaderboard ----------------------------------------------------------------------
LIVE_AST_SIZES = {"live_simple": 258, "live_multiple": 1053, "live_parallel": 16,
                  "live_parallel_multiple": 24}
"""Entries of BFCL v4's live AST categories (the live average is weighted by entries)."""

NA = "N/A"

MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
              "multi_turn_long_context")
WEB_SEARCH = ("web_search_base", "web_search_no_snippet")
MEMORY = ("memory_kv", "memory_vector", "memory_rec_sum")
SINGLE_TURN = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
               "parallel_multiple", "irrelevance", *LIVE_AST_SIZES, "live_irrelevance",
               "live_relevance")
SCORED = (*SINGLE_TURN, *MULTI_TURN, *WEB_SEARCH, *MEMORY)
"""BFCL v4's scoring categories (``ALL_SCORING_CATEGORIES``)."""

_SEARCH = ("toolrl does not run it: it needs the internet (BFCL's WebSearchAPI queries "
           "SerpAPI with an API key and fetches the pages it finds)")
_MEMORY = ("toolrl does not run it: BFCL's agentic memory episodes (its memory backends, "
           "filled by prerequisite conversations, judged on the final answer) have no toolrl "
           "env yet")
NOT_RUN: dict[str, str] = {
    **dict.fromkeys(WEB_SEARCH, _SEARCH),
    "memory_kv": _MEMORY + "; its backend also needs rank-bm25",
    "memory_rec_sum": _MEMORY,
    "memory_vector": _MEMORY + "; its backend also needs sentence-transformers, faiss-cpu and "
                               "the all-MiniLM-L6-v2 embedding model, which it loads from the "
                               "Hugging Face hub when imported (no registry package ships it)",
}
"""Why toolrl does not run a BFCL category; every other one it runs (rows from
``toolrl data convert --from bfcl``)."""


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

    Returns ``{"non_live": {column: value}, "live": {...}, "multi_turn": {...}, "agentic":
    {...}, "overall": {...}, "missing": [...], "not_run": {category: why}}`` where a value is
    an accuracy in [0, 1] or ``"N/A"``; column names are BFCL's CSV headers.
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
    turns = [get(c) for c in MULTI_TURN]
    multi_turn = _unweighted(turns, na=False)
    searches = [get(c) for c in WEB_SEARCH]
    memories = [get(c) for c in MEMORY]
    web_search = _unweighted(searches)
    memory = _unweighted(memories)
    agentic = _unweighted([web_search, memory], na=False)
    total_irrelevance = _unweighted([irrelevance, live_irrelevance])
    overall = _percentage_weighted(
        [non_live_overall, live_overall, total_irrelevance, multi_turn, agentic],
        [10, 10, 10, 30, 40])
    missing = [c for c in SCORED if get(c).display == NA]
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
        "multi_turn": {
            "Multi Turn Overall Acc": multi_turn.display, "Base": turns[0].display,
            "Miss Func": turns[1].display, "Miss Param": turns[2].display,
            "Long Context": turns[3].display,
        },
        "agentic": {
            "Agentic Overall Acc": agentic.display, "Web Search Summary": web_search.display,
            "Web Search Base": searches[0].display,
            "Web Search No Snippet": searches[1].display, "Memory Summary": memory.display,
            "Memory KV": memories[0].display, "Memory Vector": memories[1].display,
            "Memory Recursive Summarization": memories[2].display,
        },
        "overall": {
            "Overall Acc": overall.display, "Non-Live AST Acc": non_live_summary.display,
            "Live Acc": live_overall.display, "Multi Turn Acc": multi_turn.display,
            "Web Search Acc": web_search.display, "Memory Acc": memory.display,
            "Relevance Detection": live_relevance.display,
            "Irrelevance Detection": total_irrelevance.display,
        },
        "missing": missing,
        "not_run": {c: NOT_RUN.get(c, "not among the evaluated rows") for c in missing},
    }


def leaderboard_tables(board: Mapping[str, Any]) -> list[Any]:
    """rich Tables of a `leaderboard` result (percentages, as BFCL's CSV files write them)."""
    tables = []
    for key, title in (("non_live", "BFCL non-live"), ("live", "BFCL live"),
                       ("multi_turn", "BFCL multi-turn"), ("agentic", "BFCL agentic"),
                       ("overall", "BFCL overall (a category not evaluated counts 0)")):
        if key not in board:
            continue
        table = Table(title=title)
        table.add_column("column")
        table.add_column("accuracy", justify="right")
        for column, value in board[key].items():
            table.add_row(column, value if value == NA else f"{100 * value:.2f}%")
        tables.append(table)
    if board.get("not_run"):
        table = Table(title="BFCL categories not evaluated")
        table.add_column("category")
        table.add_column("why")
        for category, why in board["not_run"].items():
            table.add_row(category, why)
        tables.append(table)
    return tables
