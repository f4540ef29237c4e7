"""``--from nestful`` (NESTFUL's split files: records + function specs; a slice in
tests/data/nestful/), the contamination check against an evaluation set, and ``--limit``
reading a BFCL file no further than the rows it takes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from toolrl.cli import main
from toolrl.data import check_rows
from toolrl.data.contamination import check_contamination, normalize
from toolrl.data.convert import convert
from toolrl.data.nestful import first_wave, load_records, tool_schema

NESTFUL = Path(__file__).parents[1] / "data" / "nestful"


def sgd_split(folder: Path) -> Path:
    """An SGD-style split (untyped string parameters with allowed and default values)."""
    spec = [{"name": "Buses.FindBus", "description": "Find a bus", "query_parameters": {
        "origin": {"description": "from", "required": True, "allowed_values": []},
        "group_size": {"description": "people", "required": False, "default_value": "1",
                       "allowed_values": ["1", "2", "3"]}}},
            {"name": "Buses.BuyBusTicket", "description": "Buy", "query_parameters": {
                "origin": {"description": "from", "required": True, "allowed_values": []}}}]
    data = [{"input": "Find a bus from Austin for 2, then buy the ticket.", "output": [
        {"name": "Buses.FindBus", "arguments": {"origin": "Austin", "group_size": "2"},
         "label": "var1"},
        {"name": "Buses.BuyBusTicket", "arguments": {"origin": "$var1.origin$"},
         "label": "var2"},
        {"name": "var_result", "arguments": {"ticket": "$var2$"}}]},
            {"input": "Buy what you found.", "output": [
                {"name": "Buses.BuyBusTicket", "arguments": {"origin": "$var9.origin$"},
                 "label": "var9"}]}]
    (folder / "non-executable-sgd-spec.json").write_text(json.dumps(spec))
    (folder / "non-executable-sgd-data.json").write_text(json.dumps(data))
    return folder


def test_a_first_wave_is_the_calls_that_use_no_earlier_output():
    calls = [{"name": "a", "arguments": {"x": 1}, "label": "var1"},
             {"name": "b", "arguments": {"y": "$var1.out$"}, "label": "var2"},
             {"name": "c", "arguments": {"z": "$5 off$"}, "label": "var3"}]  # not a label
    assert [c["name"] for c in first_wave(calls)] == ["a", "c"]


def test_sgd_parameters_become_json_schema():
    spec = {"name": "f", "query_parameters": {
        "p": {"required": True, "allowed_values": ["x", "y"], "default_value": "x"},
        "q": {"type": "Date (yyyy-mm-dd)", "required": False, "description": "when"}}}
    assert tool_schema(spec) == {"name": "f", "description": "", "parameters": {
        "type": "object", "required": ["p"], "properties": {
            "p": {"type": "string", "enum": ["x", "y"], "default": "x"},
            "q": {"type": "string", "description": "when"}}}}


def test_nestful_splits_convert_to_checked_first_turn_rows(tmp_path, capsys):
    folder = tmp_path / "data_v1"
    folder.mkdir()
    for f in NESTFUL.glob("*.json"):
        shutil.copy(f, folder)
    sgd_split(folder)
    assert len(list(load_records(folder))) == 5
    out = tmp_path / "rows.jsonl"
    assert main(["data", "convert", "--from", "nestful", str(folder), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # glaive record 0's own gold call breaks its schema (optimize_route: boolean, "time")
    assert "nestful: read 5 records, wrote 3 rows, skipped 1 (1 every call uses an earlier " \
           "call's output), 1 errors" in printed
    assert "'optimize_route' must be boolean" in printed
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"nestful-non-executable-glaive-1", "nestful-non-executable-glaive-2",
                         "nestful-non-executable-sgd-0"}
    bus = rows["nestful-non-executable-sgd-0"]
    assert bus["source"] == "nestful/non-executable-sgd" and bus["category"] == "multiple"
    assert [t["function"]["name"] for t in bus["tools"]] == ["Buses.FindBus",
                                                             "Buses.BuyBusTicket"]
    assert bus["ground_truth"] == [{"Buses.FindBus": {"origin": ["Austin"],
                                                      "group_size": ["2"]}}]
    assert bus["messages"] == [{"role": "user", "content": "Find a bus from Austin for 2, "
                                                           "then buy the ticket."}]
    assert check_rows(list(rows.values()), "rows").ok


def test_contamination_finds_shared_questions_spans_and_function_names(tmp_path, capsys):
    def row(i, text, *names):
        return {"id": i, "messages": [{"role": "user", "content": text}],
                "tools": [{"type": "function", "function": {"name": n}} for n in names]}

    span = "one two three four five six seven eight nine ten eleven twelve thirteen"
    evaluation = [row("e0", "What is the GCD of 12 and 18?", "calculate_gcd"),
                  {"id": "e1", "question": [[{"role": "user", "content": f"x {span} y"}]],
                   "function": [{"name": "translate_text"}]}]
    train = [row("t0", "what is the  gcd of 12 and 18", "calculate_gcd", "other"),
             row("t1", f"{span} fourteen", "translate_text"),
             row("t2", "Translate hello into French.", "translate_text")]
    assert normalize("What's the GCD?") == "what s the gcd"
    report = check_contamination(train, evaluation)
    assert not report.clean
    assert report.shared_questions == [("t0", "e0", "what is the gcd of 12 and 18")]
    assert report.ngram_overlaps == [("t1", "e1", span)]
    assert dict(report.shared_functions) == {"calculate_gcd": 1, "translate_text": 2}
    assert check_contamination(train[1:], evaluation).clean
    for name, rows in (("train", train), ("eval", evaluation)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["data", "contamination", str(tmp_path / "train.jsonl"), "--eval",
                 str(tmp_path / "eval.jsonl")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("3 training rows vs 2 evaluation rows: 1 shared questions, 1 training "
                          "questions sharing 13 words in a row, 2 shared function names")
    assert "shared function names: translate_text (2 rows), calculate_gcd (1 rows)" in out
    clean = tmp_path / "clean" / "train.jsonl"
    assert main(["data", "contamination", str(tmp_path / "train.jsonl"), "--eval",
                 str(tmp_path / "eval.jsonl"), "--out", str(clean)]) == 0
    assert [json.loads(line)["id"] for line in clean.read_text().splitlines()] == ["t2"]
    assert "wrote 1 of 3 training rows" in capsys.readouterr().out
    assert main(["data", "contamination", str(clean), "--eval",
                 str(tmp_path / "eval.jsonl")]) == 0


def test_bfcl_limit_stops_reading_after_n_rows(tmp_path):
    data = tmp_path / "data"
    (data / "possible_answer").mkdir(parents=True)
    fn = {"name": "add", "description": "Add.", "parameters": {
        "type": "dict", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}
    questions = [{"id": f"simple_python_{i}", "question": [[{"role": "user",
                                                             "content": f"Add {i}."}]],
                  "function": [fn]} for i in range(3)]
    answers = [{"id": f"simple_python_{i}", "ground_truth": [{"add": {"a": [i]}}]}
               for i in range(3)]
    name = "BFCL_v4_simple_python.json"
    # the 4th line of each file is broken: a reader that goes past row 3 fails on it
    (data / name).write_text("".join(json.dumps(q) + "\n" for q in questions) + "{broken\n")
    (data / "possible_answer" / name).write_text(
        "".join(json.dumps(a) + "\n" for a in answers) + "{broken\n")
    out = tmp_path / "rows.jsonl"
    report = convert("bfcl", [data / name], out, limit=2)
    assert report.read == report.written == 2 and not report.errors
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [
        "simple_python_0", "simple_python_1"]
    assert convert("bfcl", [data / name], out, limit=3).written == 3
    with pytest.raises(ValueError, match="not valid JSON"):
        convert("bfcl", [data / name], out)
