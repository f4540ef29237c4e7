"""`toolrl eval`'s BFCL summary: every category it ran (Java, JavaScript and multi-turn included)
under BFCL's column names, the overall formula over what was run, the categories not run and
why, and BFCL's figures over rows the run did not train on."""

from __future__ import annotations

import pytest

from toolrl.core.trajectory import Trajectory
from toolrl.trainer.evaluate import result_tables, summarize, trained_on

FC = "toolrl/FunctionCalling-v0"


def traj(row: dict, success: bool) -> Trajectory:
    t = Trajectory(messages=[], row=row)
    t.success = success
    return t


def row(i: int, category: str, question: str) -> dict:
    return {"id": f"{category}_{i}", "category": category, "source": "bfcl",
            "messages": [{"role": "user", "content": question}]}


def test_bfcl_summary_over_rows_the_run_did_not_train_on():
    live = [row(i, "live_simple", f"please book the {i} flight to city number {i} tomorrow "
                                  f"morning at nine with my usual seat and meal") for i in range(4)]
    java = [row(i, "simple_java", f"java question {i}") for i in range(2)]
    multi = [{**row(i, "multi_turn_base", ""), "question": [[{"role": "user",
              "content": f"turn {i}"}]]} for i in range(2)]
    rows = [*live, *java, *multi]
    wins = [True, True, False, False, True, False, True, False]
    training = [{"id": "nestful-1", "messages": [{"role": "user", "content": live[0][
        "messages"][0]["content"].replace("meal", "drink")}]},  # a 13-word run
                {"id": "live_simple_1", "messages": []}]  # the row itself
    assert trained_on(rows, training) == {"live_simple_0", "live_simple_1"}
    results = summarize([traj(r, w) for r, w in zip(rows, wins, strict=True)],
                        [float(w) for w in wins], FC, training=training,
                        training_note="data.train_file x.jsonl")
    bfcl = results["bfcl"]
    overlap = bfcl["training_overlap"]
    assert overlap["left_out"] == {"live_simple": 2} and overlap["scored"]["live_simple"] == 2
    assert bfcl["per_category"]["live_simple"] == {"correct": 0, "n": 2, "accuracy": 0.0}
    assert results["per_category"]["live_simple"]["success"] == 0.5  # toolrl's own: all rows
    assert bfcl["non_live"]["Java Simple AST"] == 0.5
    assert bfcl["multi_turn"]["Base"] == 0.5
    assert bfcl["multi_turn"]["Multi Turn Overall Acc"] == pytest.approx(0.5 / 4)
    non_live = (0.5 / 3) / 4
    assert bfcl["overall"]["Overall Acc"] == pytest.approx(0.1 * non_live + 0.3 * 0.5 / 4)
    assert "SerpAPI" in bfcl["not_run"]["web_search_base"]
    titles = [t.title for t in result_tables(results)]
    assert "BFCL multi-turn" in titles and "BFCL categories not evaluated" in titles
    assert any(t.startswith("BFCL rows left out") for t in titles)
    clean = summarize([traj(r, w) for r, w in zip(rows, wins, strict=True)],
                      [float(w) for w in wins], FC)
    assert clean["bfcl"]["training_overlap"]["left_out"] == {}
    assert clean["bfcl"]["per_category"]["live_simple"]["n"] == 4
