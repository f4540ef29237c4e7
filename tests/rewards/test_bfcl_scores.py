"""BFCL's summary averages (`toolrl.core.bfcl_scores.leaderboard`) against hand-computed values."""

from __future__ import annotations

import pytest

from toolrl.core.bfcl_scores import (
    LIVE_AST_SIZES,
    MEMORY,
    MULTI_TURN,
    NA,
    WEB_SEARCH,
    leaderboard,
)


def test_every_single_turn_category_evaluated():
    board = leaderboard({
        "simple_python": (300, 400), "simple_java": (60, 100), "simple_javascript": (25, 50),
        "multiple": (150, 200), "parallel": (100, 200), "parallel_multiple": (50, 200),
        "irrelevance": (180, 240), "live_simple": (200, 258), "live_multiple": (700, 1053),
        "live_parallel": (8, 16), "live_parallel_multiple": (12, 24),
        "live_irrelevance": (442, 884), "live_relevance": (12, 16)})
    simple = (0.75 + 0.6 + 0.5) / 3  # plain mean of the three languages
    non_live = (simple + 0.75 + 0.5 + 0.25) / 4  # plain mean of the four AST columns
    live = (200 + 700 + 8 + 12) / (258 + 1053 + 16 + 24)  # weighted by entries
    irrelevance = (0.75 + 0.5) / 2
    nl, lv, ov = board["non_live"], board["live"], board["overall"]
    assert nl["Simple AST"] == pytest.approx(simple)
    assert nl["AST Summary"] == nl["Non-Live Overall Acc"] == pytest.approx(non_live)
    assert nl["Irrelevance Detection"] == 0.75 and nl["Java Simple AST"] == 0.6
    assert lv["AST Summary"] == lv["Live Overall Acc"] == pytest.approx(live)
    assert lv["Relevance Detection"] == 0.75 and lv["Irrelevance Detection"] == 0.5
    assert ov["Irrelevance Detection"] == pytest.approx(irrelevance)
    assert ov["Relevance Detection"] == 0.75
    # multi-turn (30%) and agentic (40%) were not evaluated: they count as 0, shown as numbers
    assert ov["Multi Turn Acc"] == 0.0 and ov["Web Search Acc"] == NA and ov["Memory Acc"] == NA
    assert ov["Overall Acc"] == pytest.approx(0.1 * non_live + 0.1 * live + 0.1 * irrelevance)
    assert ov["Non-Live AST Acc"] == pytest.approx(non_live)
    assert board["missing"] == [*MULTI_TURN, *WEB_SEARCH, *MEMORY]  # none single-turn


def test_missing_categories_count_as_zero_and_show_na():
    board = leaderboard({"simple_python": (8, 10), "multiple": (3, 4), "live_simple": (2, 4),
                         "irrelevance": (5, 5), "ignored_custom_category": (1, 1)})
    nl, lv, ov = board["non_live"], board["live"], board["overall"]
    assert nl["Python Simple AST"] == 0.8 and nl["Java Simple AST"] == NA
    assert nl["Simple AST"] == NA and nl["AST Summary"] == NA  # a member is missing
    simple = 0.8 / 3  # Java and JavaScript count as 0
    assert nl["Non-Live Overall Acc"] == pytest.approx((simple + 0.75) / 4)  # never N/A
    # live: missing categories weigh their full BFCL v4 size at 0 correct
    sizes = sum(LIVE_AST_SIZES.values()) - LIVE_AST_SIZES["live_simple"]
    assert lv["Live Overall Acc"] == pytest.approx(2 / (4 + sizes))
    assert lv["AST Summary"] == NA and lv["Relevance Detection"] == NA
    assert ov["Irrelevance Detection"] == NA  # live irrelevance missing
    assert ov["Overall Acc"] == pytest.approx(
        0.1 * (simple + 0.75) / 4 + 0.1 * 2 / (4 + sizes) + 0.1 * (1.0 + 0.0) / 2)
    assert "simple_java" in board["missing"] and "live_relevance" in board["missing"]
    assert "simple_python" not in board["missing"]


def test_nothing_evaluated():
    board = leaderboard({})
    assert board["overall"]["Overall Acc"] == 0.0
    assert board["non_live"]["AST Summary"] == NA and board["live"]["AST Summary"] == NA
    assert len(board["missing"]) == 22  # BFCL v4's scoring categories
    assert "SerpAPI" in board["not_run"]["web_search_base"]
    assert "all-MiniLM-L6-v2" in board["not_run"]["memory_vector"]
    assert board["not_run"]["multi_turn_base"] == "not among the evaluated rows"


def test_multi_turn_and_the_overall_formula():
    board = leaderboard({"multi_turn_base": (100, 200), "multi_turn_miss_func": (50, 200),
                         "multi_turn_miss_param": (20, 100), "simple_python": (40, 50)})
    mt = board["multi_turn"]
    assert mt["Base"] == 0.5 and mt["Miss Param"] == 0.2 and mt["Long Context"] == NA
    assert mt["Multi Turn Overall Acc"] == pytest.approx((0.5 + 0.25 + 0.2 + 0.0) / 4)
    assert board["overall"]["Multi Turn Acc"] == mt["Multi Turn Overall Acc"]
    non_live = (0.8 / 3) / 4
    assert board["overall"]["Overall Acc"] == pytest.approx(
        0.1 * non_live + 0.3 * (0.95 / 4))  # live, irrelevance, agentic: 0
    assert board["agentic"]["Agentic Overall Acc"] == 0.0
    assert board["agentic"]["Memory Summary"] == NA
