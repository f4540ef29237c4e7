"""Bring your own format: ``--from toolrl`` rows (the FunctionCalling row schema) and a slice of
NESTFUL, a dataset none of toolrl's converters knows (tests/data/nestful/, Apache-2.0), mapped
to that schema in a few lines as docs/guides/data.md shows, converted, checked and trained one
step."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from toolrl.cli import main
from toolrl.core.env import run_episode
from toolrl.core.registration import make_env
from toolrl.data import check_rows
from toolrl.data.convert import convert

NESTFUL = Path(__file__).parents[1] / "data" / "nestful"

EXAMPLE = {  # docs/guides/data.md's complete example (tests/test_docs.py keeps them the same)
    "id": "weather-1",
    "messages": [{"role": "user", "content": "Weather in Paris in fahrenheit, and book a "
                                             "table for 2 at Sakura at 19:30."}],
    "tools": [
        {"type": "function", "function": {
            "name": "get_weather", "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "city name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                         "default": "celsius"}},
                "required": ["city"]}}},
        {"type": "function", "function": {
            "name": "book_table", "description": "Book a restaurant table.",
            "parameters": {"type": "object", "properties": {
                "restaurant": {"type": "string"},
                "party": {"type": "object", "description": "who is coming",
                          "properties": {"people": {"type": "integer"},
                                         "names": {"type": "array",
                                                   "items": {"type": "string"}}},
                          "required": ["people"]},
                "time": {"type": "string", "description": "HH:MM, 24h"}},
                "required": ["restaurant", "party", "time"]}}}],
    "calls": [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "fahrenheit"}},
              {"name": "book_table", "arguments": {"restaurant": "Sakura",
                                                   "party": {"people": 2}, "time": "19:30"}}],
    "env_kwargs": {"strict_parse": True},
}


def nestful_records() -> list[dict]:
    """NESTFUL's records and spec in the toolrl row schema (docs/guides/data.md's mapping)."""
    data = json.loads((NESTFUL / "non-executable-glaive-data.json").read_text())
    spec = {s["name"]: s for s in
            json.loads((NESTFUL / "non-executable-glaive-spec.json").read_text())}

    def tool(s: dict) -> dict:
        params = s.get("query_parameters") or {}
        return {"name": s["name"], "description": s.get("description", ""), "parameters": {
            "type": "object", "required": [p for p, d in params.items() if d.get("required")],
            "properties": {p: {k: v for k, v in d.items() if k != "required"}
                           for p, d in params.items()}}}

    records = []
    for i, record in enumerate(data):
        calls = [c for c in record["output"] if c["name"] != "var_result"]  # the final answer
        names = dict.fromkeys(c["name"] for c in calls)
        records.append({"id": f"nestful-glaive-{i}", "question": record["input"],
                        "tools": [tool(spec[n]) for n in names], "calls": calls})
    return records


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_complete_example_converts_and_its_oracle_succeeds(tmp_path):
    out = tmp_path / "rows.jsonl"
    report = convert("toolrl", [write_jsonl(tmp_path / "in.jsonl", [EXAMPLE])], out)
    assert report.written == 1 and not report.errors, report.errors
    row = json.loads(out.read_text())
    assert row["category"] == "parallel_multiple" and row["env_kwargs"] == {"strict_parse": True}
    assert row["ground_truth"] == [
        {"get_weather": {"city": ["Paris"], "unit": ["fahrenheit"]}},
        {"book_table": {"restaurant": ["Sakura"], "party": [{"people": [2]}],
                        "time": ["19:30"]}}]
    assert check_rows([row], "rows").ok
    env = make_env("toolrl/FunctionCalling-v0", **row["env_kwargs"])
    try:
        episode = asyncio.run(asyncio.wait_for(run_episode(env, row=row), 60))
    finally:
        env.close()
    assert episode.success


def test_hand_written_ground_truth_and_bad_records(tmp_path):
    rows = [{"question": "Weather in Oslo?", "tools": EXAMPLE["tools"][:1],
             "ground_truth": [{"get_weather": {"city": ["Oslo"], "unit": ["", "celsius"]}}]},
            {"question": "Hi!", "tools": EXAMPLE["tools"][:1]},  # no call expected
            {"prompt": "no messages"},
            {"question": "x", "tools": [{"description": "no name"}], "calls": []}]
    report = convert("toolrl", [write_jsonl(tmp_path / "in.jsonl", rows)], tmp_path / "o.jsonl")
    assert report.written == 2
    out = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["category"] for r in out] == ["simple", "irrelevance"]
    assert [r["id"] for r in out] == ["toolrl-0", "toolrl-1"]
    errors = {i: m for i, _, m in report.errors}
    assert "no 'messages' and no 'question'" in errors[2]
    assert "tool 0 has no 'name'" in errors[3]


def test_nestful_converts_and_dependent_calls_are_refused_with_the_reason(tmp_path, capsys):
    source = write_jsonl(tmp_path / "nestful.jsonl", nestful_records())
    out = tmp_path / "nestful_rows.jsonl"
    assert main(["data", "convert", "--from", "toolrl", str(source), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "read 3 records, wrote 2 rows" in printed and "1 errors" in printed
    assert "call 2 ('calculate_pace') uses the output of call 0 ('calculate_route') " \
           "('$var1.distance$')" in printed and "dependent calls cannot be scored" in printed
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["nestful-glaive-1", "nestful-glaive-2"]
    assert {r["category"] for r in rows} == {"parallel", "parallel_multiple"}


@pytest.mark.e2e
@pytest.mark.slow
def test_nestful_rows_train_one_step(ray_cluster, tiny_model_dir, tmp_path):
    from trainer_runs import run_training_in_process, small_run_overrides

    rows = tmp_path / "nestful_rows.jsonl"
    assert convert("toolrl", [write_jsonl(tmp_path / "in.jsonl", nestful_records())],
                   rows).written == 2
    config = tmp_path / "config.yaml"  # the quickstart's task_kwargs are the Calculator's
    config.write_text("experiment_name: nestful\nenv: {id: toolrl/FunctionCalling-v0}\n")
    metrics = run_training_in_process(small_run_overrides(
        tiny_model_dir, tmp_path / "run", **{
            "data.train_file": rows, "data.val_file": rows, "rollout.max_turns": 1,
            "trainer.total_steps": 1, "rollout.max_total_tokens": 640,
            "rollout.max_prompt_tokens": 600, "rollout.engine.max_model_len": 640,
            "reward": "{rewards: [{name: bfcl_ast}, {name: format, weight: 0.1}]}"}),
        config=str(config))
    assert [r["step"] for r in metrics] == [0, 1]
    assert "train/reward_mean" in metrics[1]
