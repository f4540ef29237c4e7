"""`toolrl score-calls` on the hand-labelled cases, and the same verdicts through the training
path: real tool-call text, the real parser, the composed reward."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from toolrl.cli import main
from toolrl.core.bfcl import CATEGORIES, as_tool_call
from toolrl.core.parse import get_format
from toolrl.core.trajectory import Trajectory, TurnRecord
from toolrl.reward import build_reward

CASES = Path(__file__).parents[1] / "data" / "score_calls_cases.jsonl"


def load(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def cases():
    rows = load(CASES)
    assert len(rows) >= 200
    counts = Counter(r["category"] for r in rows)
    assert set(counts) == set(CATEGORIES) and min(counts.values()) >= 20
    assert Counter(r["expected"] for r in rows)[True] >= 60  # both verdicts well represented
    return rows


def test_score_calls_matches_every_hand_label(cases, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    assert main(["score-calls", "--reward", "bfcl_ast", "--input", str(CASES),
                 "--output", str(out)]) == 0
    results = load(out)
    assert [r["id"] for r in results] == [c["id"] for c in cases]
    wrong = [(c["id"], c["why"], r) for c, r in zip(cases, results, strict=True)
             if (r["score"] == 1.0) != c["expected"]]
    assert not wrong, wrong[:5]
    for c, r in zip(cases, results, strict=True):
        assert set(r) == {"id", "score", "error"}
        assert (r["error"] == "") == c["expected"]  # a failure always says why
    table = capsys.readouterr().out
    for cat in CATEGORIES:
        expected_acc = sum(c["expected"] for c in cases if c["category"] == cat) / sum(
            c["category"] == cat for c in cases)
        line = next(ln for ln in table.splitlines() if f" {cat} " in ln)
        assert f"{expected_acc:.3f}" in line


def _verdicts(cases, fmt_name):
    fmt = get_format(fmt_name)
    trajs = []
    for c in cases:
        calls = [as_tool_call(x) for x in c["candidate"]]
        text = fmt.render(calls, text="Let me check. ")
        trajs.append(Trajectory(
            messages=[{"role": "assistant", "content": text}],
            turns=[TurnRecord(action=text, parse=fmt.parse(text))],
            row={"id": c["id"], "category": c["category"], "ground_truth": c["ground_truth"]},
            tools=c["tools"], format=fmt_name))
    with build_reward({"rewards": [{"name": "bfcl_ast"},
                                   {"name": "format", "weight": 0.5,
                                    "gate": {"reward": "bfcl_ast"}}]}) as fn:
        return fn.score(trajs)


def test_training_path_through_the_real_parser_gives_the_same_verdicts(cases):
    """Render each candidate as Hermes tool-call text, parse it with the real parser (as the env
    does, once per turn), score with the composed bfcl_ast reward: every verdict equals the hand
    label."""
    out = _verdicts(cases, "hermes")
    assert out.components["bfcl_ast"] == [1.0 if c["expected"] else 0.0 for c in cases]
    # format pays only where the calls were right (the gate); every rendering is well-formed
    assert out.scores == [1.5 if c["expected"] else 0.0 for c in cases]
    assert out.errors == {"bfcl_ast": 0, "format": 0}


def test_deepseek_calls_score_like_hermes_calls(cases):
    """The same rows with the candidates written in DeepSeek's format (several calls in one
    ``<｜tool▁calls▁begin｜>`` block on the parallel rows): bfcl_ast gives every row the verdict
    it gives the Hermes rendering, and the hand label."""
    hermes, deepseek = _verdicts(cases, "hermes"), _verdicts(cases, "deepseek")
    assert deepseek.components["bfcl_ast"] == hermes.components["bfcl_ast"]
    assert deepseek.scores == hermes.scores
    assert sum(len(c["candidate"]) > 1 for c in cases) >= 20  # several calls in one turn
    assert deepseek.errors == {"bfcl_ast": 0, "format": 0}


def test_score_calls_console_script_and_other_rewards(tmp_path):
    sample = tmp_path / "in.jsonl"
    rows = load(CASES)[:12]
    sample.write_text("".join(json.dumps(r) + "\n" for r in rows))
    exe = shutil.which("toolrl")
    cmd = [exe] if exe else [sys.executable, "-m", "toolrl.cli"]
    out = tmp_path / "out.jsonl"
    res = subprocess.run([*cmd, "score-calls", "--reward", "toolcall_fine", "--input",
                          str(sample), "--output", str(out), "--kwargs",
                          '{"low": 0, "high": 1, "format_score": 0}', "--pass-threshold", "1"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "accuracy" in res.stdout and "simple" in res.stdout
    scores = [r["score"] for r in load(out)]
    assert all(0.0 <= s <= 1.0 for s in scores)
    for c, s in zip(rows, scores, strict=True):
        if c["case"] == "canonical":
            assert s == pytest.approx(1.0)


def test_score_calls_bad_input_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "category": "simple", "tools": [], "ground_truth": []}\n')
    assert main(["score-calls", "--reward", "bfcl_ast", "--input", str(bad), "--output",
                 str(tmp_path / "o.jsonl")]) == 2
    assert "bad.jsonl:1: missing key(s) candidate" in capsys.readouterr().err
    bad.write_text("{not json\n")
    assert main(["score-calls", "--reward", "bfcl_ast", "--input", str(bad), "--output",
                 str(tmp_path / "o.jsonl")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["score-calls", "--reward", "no_such_reward", "--input", str(CASES),
                 "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "Known rewards" in capsys.readouterr().err


def test_score_calls_reports_a_raising_reward_per_line(tmp_path, capsys):
    rows = [{"id": "ok", "category": "irrelevance", "tools": [], "ground_truth": [],
             "candidate": []},
            {"id": "broken", "category": "simple", "tools": [], "ground_truth": "f(a=1)",
             "candidate": [{"name": "f", "arguments": {}}]},
            {"id": "undecodable", "category": "simple", "tools": [],
             "ground_truth": [{"f": {}}], "candidate": [{"name": "f", "arguments": "{oops"}]}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    assert main(["score-calls", "--reward", "bfcl_ast", "--input", str(src), "--output",
                 str(out)]) == 0
    ok, broken, undecodable = load(out)
    assert ok == {"id": "ok", "score": 1.0, "error": ""}
    assert broken["score"] == 0.0 and "ValueError" in broken["error"]
    assert "ground_truth must be a list" in broken["error"]
    assert undecodable["score"] == 0.0 and "Failed to decode AST" in undecodable["error"]
    assert "errors" in capsys.readouterr().out
