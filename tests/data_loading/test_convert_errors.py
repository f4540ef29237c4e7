"""`toolrl data convert` refuses what train would refuse, row by row, and says why in one line:
shifted BFCL answers, a question file given as answers, a file of another format, xLAM tools
without a name or in OpenAI's shape, unknown xLAM types, duplicate tool names; when every record
fails no output is written and the error is printed once."""

from __future__ import annotations

import json
from pathlib import Path

from toolrl.cli import main
from toolrl.data.convert import convert


def fn(name, props, required):
    return {"name": name, "description": "", "parameters": {
        "type": "dict", "properties": props, "required": required}}


TRIANGLE = fn("calculate_triangle_area", {"base": {"type": "integer"},
                                          "height": {"type": "integer"}}, ["base", "height"])
FACTORIAL = fn("math.factorial", {"number": {"type": "integer"}}, ["number"])


def bfcl_files(tmp_path: Path, shifted: bool) -> tuple[Path, Path]:
    questions = tmp_path / "BFCL_v4_simple_python.json"
    answers = tmp_path / "answers.json"
    entries = [{"id": "simple_python_0", "question": [[{"role": "user", "content":
               "Area of a triangle with base 3 and height 4?"}]], "function": [TRIANGLE]},
               {"id": "simple_python_1", "question": [[{"role": "user", "content":
                "5 factorial?"}]], "function": [FACTORIAL]}]
    truths = [[{"calculate_triangle_area": {"base": [3], "height": [4]}}],
              [{"math.factorial": {"number": [5]}}]]
    if shifted:  # the right ids, each with the next entry's answer
        truths = truths[1:] + truths[:1]
    questions.write_text("".join(json.dumps(e) + "\n" for e in entries))
    answers.write_text("".join(json.dumps({"id": e["id"], "ground_truth": t}) + "\n"
                               for e, t in zip(entries, truths, strict=True)))
    return questions, answers


def test_bfcl_answers_shifted_by_one_are_errors_not_rows(tmp_path, capsys):
    questions, answers = bfcl_files(tmp_path, shifted=False)
    out = tmp_path / "ok.jsonl"
    assert convert("bfcl", [questions], out, answers=answers).written == 2
    questions, answers = bfcl_files(tmp_path, shifted=True)
    out = tmp_path / "shifted.jsonl"
    assert main(["data", "convert", "--from", "bfcl", str(questions), "--answers", str(answers),
                 "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "wrote 0 rows" in printed and "2 errors" in printed and not out.exists()
    assert "'math.factorial' is not among the row's tools (calculate_triangle_area)" in printed


def test_a_question_file_given_as_answers_is_one_line(tmp_path, capsys):
    questions, _ = bfcl_files(tmp_path, shifted=False)
    assert main(["data", "convert", "--from", "bfcl", str(questions), "--answers",
                 str(questions), "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{questions} is not a BFCL possible-answer file (it is a question file)" in err


def test_bfcl_on_a_file_of_another_format_is_one_line_naming_it(tmp_path, capsys):
    other = tmp_path / "non-executable-sgd-data.json"
    other.write_text(json.dumps([{"sample_id": "non-executable-sgd-data-0", "input": "hi",
                                  "output": []}]))
    assert main(["data", "convert", "--from", "bfcl", str(other), "--out",
                 str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{other} is not a BFCL question file" in err, err
    assert "'sample_id', 'input', 'output'" in err and "unknown BFCL category" not in err


def xlam_record(i, tools, answers):
    return {"id": i, "query": "Is 7 prime?", "tools": json.dumps(tools),
            "answers": json.dumps(answers)}


PRIME = {"name": "is_prime", "description": "", "parameters": {
    "n": {"type": "int", "description": "the number"}}}
CALL = [{"name": "is_prime", "arguments": {"n": 7}}]


def test_xlam_tools_that_cannot_be_read_say_why(tmp_path, capsys):
    nameless = {k: v for k, v in PRIME.items() if k != "name"}
    openai = {"type": "function", "function": {"name": "is_prime", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
    typo = {**PRIME, "parameters": {"n": {"type": "strnig"}}}
    records = [xlam_record(0, [PRIME], CALL), xlam_record(1, [nameless], CALL),
               xlam_record(2, [openai], CALL), xlam_record(3, [typo], CALL),
               xlam_record(4, [PRIME, PRIME], CALL)]
    path = tmp_path / "xlam.json"
    path.write_text(json.dumps(records))
    report = convert("xlam", [path], tmp_path / "o.jsonl")
    assert report.written == 1
    errors = {i: message for i, _, message in report.errors}
    assert "tool 0 has no 'name' (fields: 'description', 'parameters')" in errors[1]
    assert "tool 0 is in OpenAI's format" in errors[2] and "--from toolrl" in errors[2]
    assert "parameter 'n' has an unknown type 'strnig'" in errors[3]
    assert "duplicate tool name: two tools are named 'is_prime'" in errors[4]
    assert not any(m.startswith("KeyError") for m in errors.values())


def test_when_every_record_fails_nothing_is_written_and_the_error_is_printed_once(
        tmp_path, capsys):
    nameless = {k: v for k, v in PRIME.items() if k != "name"}
    path = tmp_path / "xlam.json"
    path.write_text(json.dumps([xlam_record(i, [nameless], CALL) for i in range(5)]))
    out = tmp_path / "o.jsonl"
    assert main(["data", "convert", "--from", "xlam", str(path), "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert not out.exists() and "(no output written)" in printed
    assert printed.count("has no 'name'") == 1, printed
    assert "error in record 0 (id 0) (and 4 more with the same error)" in printed
