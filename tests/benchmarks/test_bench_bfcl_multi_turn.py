"""A sample of benchmarks/bench_bfcl_multi_turn.py in the suite: the env's reward equals BFCL's
own pipeline (its FC decoding of the transcript + ``multi_turn_checker``) on the possible
answers and their perturbations, for the first entry of each scored category; the comparison can
fail (some perturbations pass BFCL, some do not, and a wrong env verdict is caught)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_bfcl_multi_turn as bench  # noqa: E402

from toolrl.core import bfcl_multi_turn as mt  # noqa: E402


def test_the_env_and_bfcls_pipeline_agree_on_a_sample():
    result = bench.run(list(mt.MULTI_TURN_CATEGORIES), limit=1, stop_every=1)
    assert result["mismatches"] == []
    assert all(o["env"] == o["bfcl"] == o["entries"] == 1 for o in result["oracle"].values())
    counts = {}
    for category in result["exact"].values():
        for kind, c in category.items():
            total, valid = counts.get(kind, (0, 0))
            counts[kind] = (total + c["total"], valid + c["bfcl_valid"])
    assert set(counts) == set(bench.KINDS)  # every kind of perturbation ran
    assert counts["gold"][1] == counts["gold"][0] and counts["dropped"][1] == 0
    assert counts["extra_state_change"][1] == 0 and counts["never_stops"][1] == 0
    assert 0 < sum(v for _, v in counts.values()) < sum(t for t, _ in counts.values())


def test_bfcls_pipeline_in_the_benchmark_tells_right_from_wrong():
    entry, truth = bench.bfcl_entries("multi_turn_base")[0]
    calls = bench.truth_calls(entry, truth)
    render = ('<tool_call>{{"name": "{}", "arguments": {}}}</tool_call>'.format)
    import json

    def transcript(turns):
        messages = []
        for question, turn in zip(entry["question"], turns, strict=True):
            messages += question
            if turn:
                messages.append({"role": "assistant", "content": "".join(
                    render(c.name, json.dumps(c.arguments)) for c in turn)})
            messages.append({"role": "assistant", "content": "Done."})
        return messages

    assert bench.bfcl_verdict(entry, truth, transcript(calls)) == (True, "")
    assert bench.bfcl_verdict(entry, truth, transcript([[], *calls[1:]])) == (
        False, "multi_turn:empty_turn_model_response")
    assert bench.bfcl_verdict(entry, truth, transcript(calls)[:-3]) == (
        False, "multi_turn:force_terminated")
