"""Task files load with clear errors; the loader resumes exactly where it stopped."""

from __future__ import annotations

import json

import pytest

from toolrl.data import TaskLoader, load_rows


def test_load_jsonl_json_and_errors(tmp_path):
    rows = [{"id": "a", "x": 1}, {"x": 2}]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    (tmp_path / "t.json").write_text(json.dumps(rows))
    for name in ("t.jsonl", "t.json"):
        loaded = load_rows(tmp_path / name)
        assert [r["x"] for r in loaded] == [1, 2]
        assert loaded[0]["id"] == "a" and loaded[1]["id"] == "t-1"
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_rows(tmp_path / "bad.jsonl")
    with pytest.raises(FileNotFoundError):
        load_rows(tmp_path / "missing.jsonl")
    (tmp_path / "t.csv").write_text("x\n1\n")
    with pytest.raises(ValueError, match="unsupported"):
        load_rows(tmp_path / "t.csv")


def test_json_files_may_hold_rows_an_object_or_json_lines(tmp_path):
    rows = [{"id": "a", "x": 1}, {"x": 2}]
    forms = {"list.json": json.dumps(rows), "wrapped.json": json.dumps({"rows": rows}),
             "lines.json": "\n".join(json.dumps(r) for r in rows) + "\n"}  # BFCL's .json
    for name, text in forms.items():
        (tmp_path / name).write_text(text)
        assert [r["x"] for r in load_rows(tmp_path / name)] == [1, 2], name
    (tmp_path / "one.json").write_text(json.dumps({"x": 3}))
    assert load_rows(tmp_path / "one.json") == [{"x": 3, "id": "one-0"}]
    assert load_rows(tmp_path / "one.json", default_ids=False) == [{"x": 3}]
    (tmp_path / "broken.json").write_text('{"x": 1}\n{"x": \n')
    with pytest.raises(ValueError, match=r"broken.json:2"):
        load_rows(tmp_path / "broken.json")


def test_resume_draws_the_same_batches():
    rows = [{"id": str(i)} for i in range(7)]
    a = TaskLoader(rows, batch_size=3, seed=5)
    first = [a.next_batch() for _ in range(2)]
    state = a.state_dict()
    rest = [[r["id"] for r in a.next_batch()] for _ in range(5)]
    b = TaskLoader(rows, batch_size=3, seed=5)
    b.load_state_dict(state)
    assert [[r["id"] for r in b.next_batch()] for _ in range(5)] == rest
    # every epoch is a permutation of all rows
    c = TaskLoader(rows, batch_size=7, seed=1)
    assert sorted(r["id"] for r in c.next_batch()) == sorted(r["id"] for r in rows)
    assert len(first[0]) == 3
