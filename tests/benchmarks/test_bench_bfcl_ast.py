"""benchmarks/bench_bfcl_ast.py's comparison in the suite, on BFCL's Java and JavaScript rows (all
150, a fraction of a second): toolrl's checker and BFCL's own ``ast_checker`` give every
possible answer and every perturbed candidate the same verdict; the comparison can fail."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_bfcl_ast as bench  # noqa: E402


def test_toolrl_and_bfcl_agree_on_java_and_javascript():
    result = bench.run(list(bench.LANGUAGE_CATEGORIES), limit=None)
    assert result["mismatches"] == []
    for category in bench.LANGUAGE_CATEGORIES:
        kinds = result["categories"][category]
        assert kinds["gold"]["total"] >= 50
        assert kinds["gold"]["bfcl_valid"] >= 0.95 * kinds["gold"]["total"]
        assert kinds["no_call"]["bfcl_valid"] == 0 and kinds["json_value"]["bfcl_valid"] == 0


def test_the_comparison_catches_a_checker_that_disagrees(monkeypatch):
    monkeypatch.setattr(bench, "toolrl_verdict", lambda *args: (True, ""))
    result = bench.run(["simple_javascript"], limit=3)
    assert {m["kind"] for m in result["mismatches"]} >= {"no_call", "dropped_param"}
