"""toolrl/FunctionCalling-v0: BFCL-style rows, categories, loaders, validation."""

from __future__ import annotations

import asyncio
import json

import pytest
from toolrl.envs.function_calling import FunctionCallingEnv, load_tasks

from toolrl.core.bfcl import CATEGORIES
from toolrl.core.env import run_episode
from toolrl.core.registration import make_env


def call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.fixture
def env():
    e = make_env("toolrl/FunctionCalling-v0")
    yield e
    e.close()


def test_synthetic_rows_cover_the_five_categories(env):
    rows = FunctionCallingEnv.make_tasks(25, seed=0)
    assert {r["category"] for r in rows} == set(CATEGORIES)
    for row in rows:
        n = len(row["ground_truth"])
        expected = {"simple": 1, "multiple": 1, "irrelevance": 0}.get(row["category"])
        assert n == expected if expected is not None else n >= 2
        if row["category"] in ("multiple", "parallel_multiple"):
            assert len(row["tools"]) > len({next(iter(g)) for g in row["ground_truth"]})
        ep = asyncio.run(run_episode(env, row=row))
        assert ep.success and ep.info["success"], row
        assert len(ep.turns) == 1 and ep.finish_reason == "terminated"  # one turn


def test_outcome_follows_bfcl_possible_answers(env):
    row = {"id": "simple_1", "messages": [{"role": "user", "content": "Weather in Paris?"}],
           "tools": [{"type": "function", "function": {
               "name": "get_weather", "description": "w", "parameters": {
                   "type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string"}},
                   "required": ["city"]}}}],
           "ground_truth": [{"get_weather": {"city": ["Paris", "Paris, France"],
                                             "unit": ["", "celsius"]}}]}
    cases = [(call("get_weather", city="Paris"), True),
             (call("get_weather", city="paris, france", unit="celsius"), True),
             (call("get_weather", city="Lyon"), False),
             (call("get_weather", city="Paris", unit="kelvin"), False),
             (call("get_weather", city="Paris") * 2, False),
             ("It is sunny.", False)]
    for action, success in cases:
        env.reset(options=row)
        _, reward, terminated, _, info = env.step(action)
        assert terminated and info["success"] is success, action
        assert reward == float(success)
    env.reset(options=row)
    assert env.unwrapped.row["category"] == "simple"  # from the BFCL id prefix


def test_schema_violations_are_reported_even_without_execution(env):
    row = FunctionCallingEnv.make_tasks(1, seed=3, categories=["simple"])[0]
    env.reset(options=row)
    name = row["tools"][0]["function"]["name"]
    _, _, terminated, _, info = env.step(call(name, bogus=1))
    assert terminated and not info["success"]
    [error] = info["errors"]  # one typed error per call, listing every violation
    assert error["type"] == "missing_required" and "unknown argument 'bogus'" in error["message"]


def test_irrelevance_passes_only_without_calls(env):
    row = FunctionCallingEnv.make_tasks(1, seed=0, categories=["irrelevance"])[0]
    env.reset(options=row)
    assert env.step("Sorry, I can't do that.")[4]["success"] is True
    env.reset(options=row)
    name = row["tools"][0]["function"]["name"]
    assert env.step(call(name))[4]["success"] is False


def test_loaders_json_jsonl_parquet_and_bfcl(tmp_path, env):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = FunctionCallingEnv.make_tasks(10, seed=7)
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    nested = ("messages", "tools", "ground_truth")
    table = pa.Table.from_pylist([{k: json.dumps(v) if k in nested else v for k, v in r.items()}
                                  for r in rows])
    pq.write_table(table, tmp_path / "rows.parquet")
    for name in ("rows.json", "rows.jsonl", "rows.parquet"):
        assert load_tasks(tmp_path / name) == rows, name

    # BFCL's own files: a question file (BFCL types) and a possible-answer file, joined by id
    question = {"id": "parallel_multiple_0", "question": [[{"role": "user", "content":
                "Area of a 3 by 4 rectangle and of a circle of radius 2."}]],
                "function": [{"name": "area", "description": "Area.", "parameters": {
                    "type": "dict", "properties": {"shape": {"type": "string"},
                                                   "w": {"type": "float"},
                                                   "h": {"type": "float"}},
                    "required": ["shape", "w"]}}]}
    answer = {"id": "parallel_multiple_0", "ground_truth": [
        {"area": {"shape": ["rectangle"], "w": [3.0], "h": [4.0]}},
        {"area": {"shape": ["circle"], "w": [2.0], "h": [""]}}]}
    (tmp_path / "q.json").write_text(json.dumps([question]))
    (tmp_path / "a.jsonl").write_text(json.dumps(answer))
    [bfcl] = load_tasks(tmp_path / "q.json", answers=tmp_path / "a.jsonl")
    assert bfcl["category"] == "parallel_multiple" and bfcl["messages"][0]["role"] == "user"
    env.reset(options=bfcl)
    assert env.unwrapped.tools_schema()[0]["function"]["parameters"]["type"] == "object"
    action = call("area", shape="circle", w=2) + call("area", shape="rectangle", w=3, h=4)
    assert env.step(action)[4]["success"] is True  # any order; int accepted for float
    (tmp_path / "rows.csv").write_text("id\n1\n")
    with pytest.raises(ValueError, match="unsupported task file type"):
        load_tasks(tmp_path / "rows.csv")


def test_env_draws_rows_from_a_dataset(tmp_path):
    rows = FunctionCallingEnv.make_tasks(4, seed=1)
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = make_env("toolrl/FunctionCalling-v0", data=str(path))
    ids = {env.reset(seed=s)[1]["task_id"] for s in range(20)}
    assert ids <= {r["id"] for r in rows} and len(ids) > 1
    env.close()


def test_strict_parse_follows_bfcl_and_can_be_relaxed():
    row = FunctionCallingEnv.make_tasks(1, seed=5, categories=["simple"])[0]
    broken = '<tool_call>{"name": </tool_call>'
    for strict, success in ((True, False), (False, True)):
        env = make_env("toolrl/FunctionCalling-v0", strict_parse=strict)
        env.reset(options=row)
        info = env.step(env.unwrapped.oracle_action() + broken)[4]
        assert info["success"] is success
        if strict:
            assert env.unwrapped.check["error_type"] == "ast_decoder:decoder_failed"
        env.close()
    with pytest.raises(ValueError, match="no synthetic rows"):
        make_env("toolrl/FunctionCalling-v0", categories=["live_simple"])


def test_unscorable_rows_fail_at_reset(env):
    row = {"id": "memory_kv_0", "messages": [{"role": "user", "content": "q"}], "tools": [],
           "ground_truth": [{"f": {}}]}
    with pytest.raises(ValueError, match="cannot score BFCL category 'memory_kv'"):
        env.reset(options=row)
