"""Tools: schemas from functions / pydantic / explicit schemas, validation, limits, errors."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Literal

import pydantic
import pytest

from toolrl.core.tools import Tool, ToolFailure, normalize_parameters, tool


def run(coro):
    return asyncio.run(coro)


@tool
def get_weather(city: str, unit: Literal["c", "f"] = "c", days: int = 1) -> str:
    """Weather for a city.

    Args:
        city: the city
        unit: temperature unit
        days: forecast length
    """
    return f"{city}: 20{unit} for {days} day(s)"


def test_schema_from_type_hints_and_docstring():
    fn = get_weather.schema["function"]
    assert fn["name"] == "get_weather" and fn["description"] == "Weather for a city."
    props = fn["parameters"]["properties"]
    assert props["city"] == {"type": "string", "description": "the city"}
    assert props["unit"]["enum"] == ["c", "f"]
    assert fn["parameters"]["required"] == ["city"]
    assert get_weather("Oslo") == "Oslo: 20c for 1 day(s)"  # still a plain function


def test_pydantic_fallback_without_docstring_args():
    def area(width: float, height: float | None = None) -> float:
        return width * (height or width)

    params = Tool.from_function(area).parameters
    assert params["required"] == ["width"]
    assert "title" not in json.dumps(params)  # pydantic titles are stripped
    assert run(Tool.from_function(area).acall({"width": 2, "height": None})).content == "4"


def test_from_pydantic_model_and_explicit_schema():
    class Search(pydantic.BaseModel):
        """Search the web."""

        query: str = pydantic.Field(description="what to look for")
        limit: int = 3

    t = Tool.from_pydantic(Search, lambda q: f"{q.query}:{q.limit}")
    assert t.name == "search" and t.description == "Search the web."
    assert run(t.acall({"query": "x"})).content == "x:3"
    assert run(t.acall({"limit": 1})).error["type"] == "missing_required"

    schema = {"type": "function", "function": {"name": "ping", "description": "Ping.",
                                               "parameters": {"type": "object", "properties": {
                                                   "host": {"type": "string"}}}}}
    assert Tool.from_schema(schema, lambda host: "pong").schema == schema
    assert run(Tool.from_schema(schema).acall({"host": "a"})).content == "ok"  # schema-only
    with pytest.raises(ValueError, match="invalid parameters schema"):
        Tool.from_schema({"name": "bad", "parameters": {"type": "object",
                                                        "properties": {"x": {"type": 7}}}})


def test_bfcl_and_openapi_types_are_normalized():
    params = normalize_parameters({"type": "dict", "properties": {
        "x": {"type": "float"}, "t": {"type": "tuple", "items": {"type": "integer"}},
        "n": {"type": "string", "nullable": True}, "title": {"type": "string"}}})
    assert params["type"] == "object"
    assert params["properties"]["x"]["type"] == "number"
    assert params["properties"]["t"]["type"] == "array"
    assert params["properties"]["n"]["type"] == ["string", "null"]
    assert "title" in params["properties"]  # a parameter named "title" is kept


@pytest.mark.parametrize(("arguments", "kind", "fragment"), [
    ({}, "missing_required", "missing required argument 'city'"),
    ({"city": 3}, "wrong_type", "argument 'city' must be string, got integer"),
    ({"city": "Oslo", "days": 1.5}, "wrong_type", "argument 'days' must be integer"),
    ({"city": "Oslo", "country": "NO"}, "unknown_param", "unknown argument 'country'"),
    ({"city": "Oslo", "unit": "k"}, "enum_mismatch", "must be one of"),
    (["Oslo"], "wrong_type", "arguments must be a JSON object"),
])
def test_schema_violations_are_typed_errors(arguments, kind, fragment):
    result = run(get_weather.acall(arguments))
    assert result.error["type"] == kind and result.error["tool"] == "get_weather"
    assert fragment in result.error["message"]
    observation = json.loads(result.content)  # what the model reads: short JSON
    assert observation == {"error": kind, "tool": "get_weather",
                           "message": result.error["message"]}
    assert len(result.content) < 400


def test_other_schema_keywords_are_invalid_value():
    t = Tool.from_schema({"name": "n", "parameters": {"type": "object", "properties": {
        "k": {"type": "integer", "minimum": 1}}}})
    assert run(t.acall({"k": 0})).error["type"] == "invalid_value"


def test_exceptions_and_failures_become_observations():
    def boom(x: int) -> int:
        """Divide.

        Args:
            x: divisor
        """
        return 1 // x

    result = run(Tool.from_function(boom).acall({"x": 0}))
    assert result.error["type"] == "tool_exception"
    assert "ZeroDivisionError" in result.content

    def refuse() -> str:
        raise ToolFailure("http_error", "HTTP 503: try later")

    failure = run(Tool.from_function(refuse).acall({}))
    assert failure.error == {"type": "http_error", "tool": "refuse",
                             "message": "HTTP 503: try later"}


def test_timeouts_for_async_and_sync_tools():
    async def slow_async() -> str:
        await asyncio.sleep(30)
        return "late"

    release = threading.Event()

    def slow_sync() -> str:
        release.wait(30)
        return "late"

    async def call_then_release(fn):
        try:
            return await Tool.from_function(fn, timeout=0.2).acall({})
        finally:
            release.set()  # a timed-out sync tool keeps its thread: let it finish

    for fn in (slow_sync, slow_async):
        result = run(call_then_release(fn))
        assert result.error["type"] == "timeout", fn
        assert "0.2 s" in result.error["message"]
    # the env-level limit applies when the tool has none
    assert run(Tool.from_function(slow_async).acall({}, timeout=0.1)).error["type"] == "timeout"


def test_output_cap_truncates_with_a_marker():
    def dump() -> str:
        return "x" * 5000

    result = run(Tool.from_function(dump, max_output_chars=100).acall({}))
    assert result.truncated and result.ok
    assert result.error["type"] == "output_truncated"
    assert result.content == "x" * 100 + "...[truncated 4900 chars]"
    assert run(Tool.from_function(dump).acall({}, max_output_chars=10)).content.startswith(
        "x" * 10 + "...[truncated")


def test_async_tools_and_method_binding():
    class Counter:
        def __init__(self):
            self.n = 0

        @tool(inline=True)
        def bump(self, by: int) -> int:
            """Add to the counter.

            Args:
                by: amount
            """
            self.n += by
            return self.n

    a, b = Counter(), Counter()
    assert "self" not in a.bump.parameters["properties"]
    assert run(a.bump.acall({"by": 2})).value == 2
    assert run(b.bump.acall({"by": 5})).value == 5
    assert (a.n, b.n) == (2, 5)  # each instance's tool is bound to that instance

    async def fetch(url: str) -> dict:
        """Fetch.

        Args:
            url: where
        """
        return {"url": url, "ok": True}

    assert json.loads(run(Tool.from_function(fetch).acall({"url": "u"})).content) == {
        "url": "u", "ok": True}


def test_a_schema_from_type_hints_alone_keeps_the_documented_key_order():
    """Without an Args section the schema comes from pydantic; its keys follow the order
    get_json_schema gives (type, properties, required), so jsonschema reports a call that is
    both missing and unknown arguments as ``missing_required`` either way."""
    from toolrl.core.tools import Tool

    def plain(a: float, b: float) -> float:
        """a + b"""
        return a + b

    def documented(a: float, b: float) -> float:
        """a + b

        Args:
            a: a
            b: b
        """
        return a + b

    bare, doc = Tool.from_function(plain), Tool.from_function(documented)
    assert list(bare.parameters)[:3] == list(doc.parameters)[:3] == ["type", "properties",
                                                                     "required"]
    plain_error, doc_error = bare.validate({"c": 1}), doc.validate({"c": 1})
    assert plain_error["type"] == doc_error["type"] == "missing_required"
    assert plain_error["message"] == doc_error["message"]
