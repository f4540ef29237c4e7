"""`toolrl data convert` on small fixtures in each published layout (tests/data/formats/), read
as the JSON the datasets ship, as JSONL and as parquet: rows, schemas, ground truth, and every
record that cannot be converted counted with its reason."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from toolrl.cli import main
from toolrl.core.bfcl import check_calls, tool_schemas
from toolrl.core.env import run_episode
from toolrl.core.registration import make_env
from toolrl.data.convert import convert
from toolrl.data.toolace import parse_bracket_calls

FORMATS = Path(__file__).parents[1] / "data" / "formats"


def published(fmt, tmp_path, kind):
    """The fixture of ``fmt`` as ``kind``: the JSON list as published, JSONL, or parquet."""
    records = json.loads((FORMATS / f"{fmt}.json").read_text())
    if kind == "json":
        return FORMATS / f"{fmt}.json"
    path = tmp_path / f"{fmt}.{kind}"
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        pq.write_table(pa.Table.from_pylist(records), path)
    return path


def converted(fmt, tmp_path, kind="json"):
    out = tmp_path / f"{fmt}-{kind}.jsonl"
    report = convert(fmt, [published(fmt, tmp_path, kind)], out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return report, {r["id"]: r for r in rows}, out


@pytest.mark.parametrize("fmt", ["xlam", "toolace", "hermes", "glaive"])
def test_json_jsonl_and_parquet_give_the_same_rows(fmt, tmp_path):
    report, rows, _ = converted(fmt, tmp_path)
    assert report.written == len(rows) > 0
    for kind in ("jsonl", "parquet"):
        other, again, _ = converted(fmt, tmp_path, kind)
        assert again == rows, kind
        assert (other.read, other.written, other.skipped, len(other.errors)) == \
            (report.read, report.written, report.skipped, len(report.errors))


@pytest.mark.parametrize("fmt", ["xlam", "toolace", "hermes", "glaive"])
def test_every_row_is_a_solvable_function_calling_row(fmt, tmp_path):
    _, rows, _ = converted(fmt, tmp_path)
    env = make_env("toolrl/FunctionCalling-v0")
    try:
        for row in rows.values():
            assert set(row) == {"id", "env", "source", "category", "messages", "tools",
                                "ground_truth"}
            assert row["env"] == "toolrl/FunctionCalling-v0" and row["source"] == fmt
            assert all(t["type"] == "function" and t["function"]["parameters"]["type"]
                       in ("object", "dict") for t in row["tools"])
            assert row["messages"][-1]["role"] in ("user", "tool")
            assert not any(m["role"] == "system" for m in row["messages"])
            ep = asyncio.run(asyncio.wait_for(run_episode(env, row=row), 60))
            assert ep.success, row["id"]
    finally:
        env.close()


def test_xlam(tmp_path):
    report, rows, out = converted("xlam", tmp_path)
    assert (report.read, report.written, dict(report.skipped)) == (5, 3, {})
    assert [(i, rid) for i, rid, _ in report.errors] == [(3, 3), (4, 4)]
    assert "'check_prime', which is not among the tools offered" in report.errors[0][2]
    assert "'answers' is not valid JSON" in report.errors[1][2]
    errors = [json.loads(line) for line in Path(f"{out}.errors.jsonl").read_text().splitlines()]
    assert [e["index"] for e in errors] == [3, 4]

    parallel = rows["xlam-0"]
    assert parallel["category"] == "parallel"
    assert parallel["messages"] == [{"role": "user", "content":
                                     "Where can I find live giveaways for beta access and games?"}]
    assert parallel["ground_truth"] == [{"live_giveaways_by_type": {"type": ["beta"]}},
                                        {"live_giveaways_by_type": {"type": ["game"]}}]
    [giveaways] = parallel["tools"]
    assert giveaways["function"]["parameters"] == {
        "type": "object", "required": ["type"], "properties": {"type": {
            "type": "string", "default": "game",
            "description": "The type of giveaways to retrieve (e.g., game, loot, beta)."}}}
    assert rows["xlam-1"]["category"] == "multiple"  # one call, two tools offered
    search = rows["xlam-2"]
    schema = tool_schemas(search["tools"])["search_products"]
    assert schema["required"] == ["query", "tags"]  # ", optional" marks the rest
    assert schema["properties"]["tags"] == {"type": "array", "items": {"type": "string"},
                                            "description": "Tags to filter by."}
    assert schema["properties"]["limit"]["type"] == "integer"
    # an optional argument equal to its default may also be left out
    assert search["ground_truth"] == [{"search_products": {
        "query": ["wireless headphones"], "limit": [10, ""], "tags": [["audio", "sale"]]}}]


def test_toolace(tmp_path):
    report, rows, _ = converted("toolace", tmp_path)
    assert (report.read, report.written) == (4, 3)
    assert dict(report.skipped) == {"no tools in the system prompt": 1}
    [(index, _, message)] = report.errors
    assert index == 3 and "malformed call list" in message
    first, second, ask = rows["toolace-0-0"], rows["toolace-0-1"], rows["toolace-1-0"]
    assert first["category"] == "multiple"
    assert first["ground_truth"] == [{"Market Trends API": {"trend_type": ["MARKET_INDEXES"],
                                                            "country": ["us", ""]}}]
    assert second["category"] == "parallel_multiple"
    assert second["ground_truth"] == [
        {"Get Stock Quote": {"symbol": ["AAPL"], "realtime": [True],
                             "fields": [["price", "volume"]]}},
        {"Market Trends API": {"trend_type": ["GAINERS"], "country": ["us", ""]}}]
    # the history: the earlier call as tool_calls, its result, the answer, the new question
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool", "assistant",
                                                       "user"]
    assert second["messages"][1]["tool_calls"] == [{"type": "function", "function": {
        "name": "Market Trends API",
        "arguments": {"trend_type": "MARKET_INDEXES", "country": "us"}}}]
    assert ask["category"] == "irrelevance" and ask["ground_truth"] == []  # it asks instead
    assert tool_schemas(first["tools"])["Market Trends API"]["type"] == "dict"


@pytest.mark.parametrize("text,calls", [
    ('[Market Trends API(trend_type="GAINERS")]', [("Market Trends API", {"trend_type":
                                                                          "GAINERS"})]),
    ("[User Feed (Video Posts) V2(username='sunny', $top=10), User Feed()]",
     [("User Feed (Video Posts) V2", {"username": "sunny", "$top": 10}), ("User Feed", {})]),
    ('[SEC Filings(q={"a": true, "b": null}, lon=-93.2, xs=[1, "a,b)"], from="2024")]',
     [("SEC Filings", {"q": {"a": True, "b": None}, "lon": -93.2, "xs": [1, "a,b)"],
                       "from": "2024"})]),
    ("[SEC Filings(ok=True, none=None)]", [("SEC Filings", {"ok": True, "none": None})]),
    ("Here is my answer [not a call]", None),
    ("[Unknown(a=1)]", None),
])
def test_toolace_bracket_calls(text, calls):
    names = ["Market Trends API", "User Feed (Video Posts) V2", "User Feed", "SEC Filings"]
    parsed = parse_bracket_calls(text, names)
    assert (None if parsed is None else [(c.name, c.arguments) for c in parsed]) == calls


@pytest.mark.parametrize("text", ["[SEC Filings(a=1]", "[SEC Filings(1, 2)]",
                                  "[SEC Filings(a=open('x'))]", "[SEC Filings(a=1 2)]",
                                  "[SEC Filings(a=1), Nope(b=2)]"])
def test_toolace_malformed_call_lists_are_errors(text):
    with pytest.raises(ValueError):
        parse_bracket_calls(text, ["SEC Filings"])


def test_hermes(tmp_path):
    report, rows, _ = converted("hermes", tmp_path)
    assert (report.read, report.written) == (4, 3)
    assert dict(report.skipped) == {"no tools offered": 1}  # the JSON-mode record
    [(index, record_id, message)] = report.errors
    assert (index, record_id) == (3, "bad-1") and "'open_door'" in message
    camera = rows["hermes-85f6c398-69c7-4df2-aed1-29d614a93a26-0"]  # tools from <tools> repr
    assert camera["category"] == "simple"
    assert camera["ground_truth"] == [{"get_camera_live_feed": {
        "camera_id": ["front_door"], "stream_quality": ["1080p"]}}]
    assert tool_schemas(camera["tools"])["get_camera_live_feed"]["properties"][
        "stream_quality"]["enum"] == ["720p", "1080p", "4k"]
    lights = rows["hermes-b3a1-0"]  # tools from the "tools" column, two parallel calls
    assert lights["category"] == "parallel_multiple"
    assert lights["ground_truth"] == [{"set_light_state": {"room": ["kitchen"], "on": [True]}},
                                      {"set_light_state": {"room": ["bedroom"], "on": [True]}}]
    weather = rows["hermes-b3a1-1"]  # answered without a call: nothing fits
    assert weather["category"] == "irrelevance"
    assert [m["role"] for m in weather["messages"]] == ["user", "assistant", "tool",
                                                        "assistant", "user"]


def test_glaive(tmp_path):
    report, rows, _ = converted("glaive", tmp_path)
    assert (report.read, report.written) == (4, 3)
    assert dict(report.skipped) == {"no functions offered": 1}
    [(index, _, message)] = report.errors
    assert index == 3 and "arguments are not JSON" in message
    news, bmi, pizza = rows["glaive-0-0"], rows["glaive-0-1"], rows["glaive-1-0"]
    assert news["ground_truth"] == [{"get_news_headlines": {"country": ["United States"]}}]
    assert news["category"] == "multiple"  # two functions offered
    assert [t["function"]["name"] for t in news["tools"]] == ["get_news_headlines",
                                                               "calculate_bmi"]
    assert bmi["ground_truth"] == [{"calculate_bmi": {"weight": [70], "height": [1.75]}}]
    assert bmi["messages"][2] == {"role": "tool", "content":
                                  '{"headlines": ["Biden announces new vaccine mandates"]}'}
    assert bmi["messages"][3]["content"].startswith("Here are the latest headlines")
    assert "<|endoftext|>" not in json.dumps(bmi["messages"])
    assert pizza["category"] == "irrelevance" and pizza["ground_truth"] == []
    # the answer's own call passes its ground truth, a different value does not
    call = {"name": "calculate_bmi", "arguments": {"weight": 70.0, "height": 1.75}}
    assert check_calls([call], bmi["ground_truth"], bmi["category"], bmi["tools"]).valid
    call["arguments"]["height"] = 1.8
    assert not check_calls([call], bmi["ground_truth"], bmi["category"], bmi["tools"]).valid


def test_command_line_and_bad_arguments(tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    assert main(["data", "convert", "--from", "xlam", str(FORMATS / "xlam.json"),
                 str(published("xlam", tmp_path, "parquet")), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "read 10 records, wrote 6 rows" in printed and "4 errors" in printed
    assert "record 3 (id 3)" in printed and f"{out}.errors.jsonl" in printed
    assert main(["data", "convert", "--from", "xlam", str(FORMATS / "xlam.json"), "--limit",
                 "1", "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 1
    assert not Path(f"{out}.errors.jsonl").exists()  # a clean rerun leaves no stale errors
    assert main(["data", "convert", "--from", "xlam", str(FORMATS / "xlam.json"), "--out",
                 str(tmp_path / "x.parquet")]) == 2
    assert "name it *.jsonl" in capsys.readouterr().err
    assert main(["data", "convert", "--from", "xlam", str(tmp_path / "missing.json"),
                 "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["data", "convert", "--from", "glaive", str(FORMATS / "xlam.json"), "--out",
                 str(out)]) == 1  # the wrong format: every record is an error, none written
    printed = capsys.readouterr().out
    assert "wrote 0 rows" in printed and "5 errors" in printed
    assert "no field 'system', 'chat'" in printed and "is this glaive data?" in printed
    with pytest.raises(SystemExit):
        main(["data", "convert", "--from", "sharegpt", "x.json", "--out", str(out)])
