"""Tool-call formats: known inputs, malformed inputs, and hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolrl.core.parse import FORMATS, get_format
from toolrl.core.types import ParseResult, ToolCall
from toolrl.registry import RegistryError

ALL = ["hermes", "json", "llama3_json", "mistral", "deepseek"]


def test_registry_lists_formats_and_rejects_unknown():
    assert set(ALL) <= set(FORMATS.names())
    with pytest.raises(RegistryError, match="hermes"):
        get_format("nope")


def test_hermes_matches_the_tiny_chat_template():
    """Rendering equals what the tiny model's template emits, and parsing it gives the calls."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from toolrl.models.tiny import CHAT_TEMPLATE

    calls = [ToolCall("add", {"a": 1, "b": 2}), ToolCall("lookup", {"q": "x < y", "n": [1.5]})]
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Sure.",
                 "tool_calls": [c.to_openai() for c in calls]}]
    rendered = render_jinja_template(conversations=[messages], chat_template=CHAT_TEMPLATE)[0][0]
    assistant = rendered.split("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    hermes = get_format("hermes")
    assert hermes.render(calls, "Sure.") == assistant
    assert hermes.parse(assistant) == ParseResult(calls=calls, text="Sure.")


def test_hermes_whitespace_and_several_calls():
    text = ('Let me compute.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
            '</tool_call>\n<tool_call>{"name":"sub","arguments":{"a":5,"b":3}}</tool_call>')
    result = get_format("hermes").parse(text)
    assert result.calls == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("sub", {"a": 5, "b": 3})]
    assert result.text == "Let me compute."
    assert result.ok and not result.repaired


@pytest.mark.parametrize(("text", "kind"), [
    ('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>', "invalid_json"),
    ('<tool_call>{"name": "add", "arguments": {"a": 1}}', "unclosed_tag"),
    ('<tool_call>{"arguments": {"a": 1}}</tool_call>', "missing_name"),
    ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "bad_arguments"),
    ('<tool_call>{"name": "add", "arguments": "{oops"}</tool_call>', "bad_arguments"),
    ('<tool_call>[{"name": "add"}]</tool_call>', "not_an_object"),
    ('<tool_call></tool_call>', "empty_call"),
    ('done </tool_call>', "stray_close_tag"),
    ('<tool_call>{"name": "add", "arguments": {"a": NaN}}</tool_call>', "invalid_json"),
])
def test_hermes_malformed_calls_are_structured_errors(text, kind):
    result = get_format("hermes").parse(text)
    assert not result.calls
    assert kind in [e.kind for e in result.errors]
    assert all(e.span is None or 0 <= e.span[0] <= e.span[1] <= len(text) for e in result.errors)


def test_good_call_survives_next_to_a_bad_one():
    text = ('<tool_call>{"name": "a", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "b", "arguments": {</tool_call>')
    result = get_format("hermes").parse(text)
    assert result.calls == [ToolCall("a", {})]
    assert [e.kind for e in result.errors] == ["invalid_json"]


def test_repair_is_opt_in_and_flagged():
    text = "<tool_call>{'name': 'add', 'arguments': {'a': 1, 'b': True}}</tool_call>"
    assert get_format("hermes").parse(text).calls == []
    repaired = get_format("hermes", repair=True).parse(text)
    assert repaired.calls == [ToolCall("add", {"a": 1, "b": True})]
    assert repaired.repaired and repaired.ok
    cut = get_format("hermes", repair=True).parse('<tool_call>{"name": "add", "arguments": {"a": 1')
    assert cut.calls == [ToolCall("add", {"a": 1})] and cut.repaired


def test_json_llama_and_mistral_specifics():
    assert get_format("json").parse('```json\n[{"name": "a", "arguments": {"x": 1}}]\n```').calls \
        == [ToolCall("a", {"x": 1})]
    assert get_format("json").parse("The answer is 4.") == ParseResult([], "The answer is 4.")
    llama = get_format("llama3_json").parse(
        '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}')
    assert llama.calls == [ToolCall("a", {"x": 1}), ToolCall("b", {})]
    mistral = get_format("mistral")
    old = mistral.parse('Sure[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}, "id": "abc123xyz"}]')
    assert old.calls == [ToolCall("a", {"x": 1}, id="abc123xyz")] and old.text == "Sure"
    new = mistral.parse('[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{}')
    assert new.calls == [ToolCall("a", {"x": 1}), ToolCall("b", {})]
    assert mistral.parse("[TOOL_CALLS]a").errors[0].kind == "missing_arguments"


DS = get_format("deepseek")


def test_deepseek_several_calls_in_one_turn_and_its_errors():
    calls = [ToolCall("add", {"a": 1, "b": 2}), ToolCall("mul", {"a": 3, "b": 4}),
             ToolCall("submit", {"answer": 7})]
    text = DS.render(calls, "<think>\nadd, then mul\n</think>\n\n")
    assert text.count(DS.calls_begin) == 1 and text.count(DS.call_end) == 3
    assert text.endswith(DS.call_end + DS.calls_end)
    assert DS.parse(text) == ParseResult(calls=calls, text="<think>\nadd, then mul\n</think>")
    # a model stopped on <｜tool▁calls▁end｜> as a stop string: the calls are all there
    assert DS.parse(text[: -len(DS.calls_end)]).calls == calls
    # DeepSeek's own template writes the arguments after the fence without a newline variant
    bare = f"{DS.calls_begin}{DS.call_begin}function{DS.sep}f\n{{\"x\": 1}}{DS.call_end}"
    assert DS.parse(bare).calls == [ToolCall("f", {"x": 1})]
    kinds = {
        f"{DS.calls_begin}{DS.call_begin}function{DS.sep}f\n```json\n{{bad\n```": "unclosed_tag",
        f"{DS.calls_begin}{DS.call_begin}function f\n{{}}{DS.call_end}": "missing_name",
        f"{DS.calls_begin}{DS.call_begin}function{DS.sep}f\n[1]{DS.call_end}": "bad_arguments",
        f"{DS.calls_begin}{DS.calls_end}": "empty_call",
        f"{DS.call_begin}function{DS.sep}f\n{{}}{DS.call_end}": "unclosed_tag",
        f"{DS.calls_begin}junk{DS.call_begin}function{DS.sep}f\n{{}}{DS.call_end}": "stray_text",
    }
    for bad, kind in kinds.items():
        assert [e.kind for e in DS.parse(bad).errors] == [kind], bad


def test_tags_inside_argument_strings_round_trip():
    calls = [ToolCall("echo", {"s": "</tool_call><tool_call>{\"name\": \"x\"}"}),
             ToolCall("echo", {"s": DS.call_end + DS.calls_end + DS.call_begin})]
    for name in ALL:
        fmt = get_format(name)
        assert fmt.parse(fmt.render(calls)).calls == calls, name


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("repair", [False, True])
def test_pathological_inputs_finish(name, repair):
    """Inputs that make naive parsers quadratic or recursive: must return, not raise."""
    fmt = get_format(name, repair=repair)
    for text in ["<tool_call>" * 20000, "[" * 100000, "<tool_call>" + "[" * 50000 + "</tool_call>",
                 "{" * 100000, "[TOOL_CALLS]" * 20000, '{"name": "a"};' * 20000,
                 "<|python_tag|>" + '{"name":"a"};' * 10000, "</tool_call>" * 20000,
                 "[TOOL_CALLS]x[ARGS]" * 10000, DS.calls_begin + DS.call_begin * 20000,
                 DS.calls_begin + (DS.call_begin + "function" + DS.sep + "a\n{") * 5000]:
        assert isinstance(fmt.parse(text), ParseResult)


# --- properties --------------------------------------------------------------------------------
MARKUP = ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"name"', '"arguments"',
          '"parameters"', ":", ",", '"', "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", ";", "\n",
          " ", "null", "1", "```json\n", "```", "\\", DS.calls_begin, DS.calls_end,
          DS.call_begin, DS.call_end, DS.sep, "function"]
near_miss = st.lists(st.one_of(st.sampled_from(MARKUP), st.text(max_size=5)), max_size=60).map(
    "".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(max_size=400), near_miss), name=st.sampled_from(ALL),
       repair=st.booleans())
def test_arbitrary_text_never_raises(text, name, repair):
    result = get_format(name, repair=repair).parse(text)
    assert isinstance(result, ParseResult)
    assert all(isinstance(c, ToolCall) and isinstance(c.arguments, dict) for c in result.calls)
    assert isinstance(result.text, str)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
calls_strategy = st.lists(st.builds(
    ToolCall, name=st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True),
    arguments=st.dictionaries(st.text(max_size=10), json_values, max_size=4)), max_size=4)
free_text = st.text(alphabet=st.characters(blacklist_characters="<>[]{}`",
                                           blacklist_categories=("Cs",)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(calls=calls_strategy, text=free_text, name=st.sampled_from(ALL))
def test_render_then_parse_round_trips(calls, text, name):
    fmt = get_format(name)
    result = fmt.parse(fmt.render(calls, text))
    assert result.ok
    assert [c.to_dict() for c in result.calls] == [c.to_dict() for c in calls]
    assert result.text == text.strip()


@settings(max_examples=50, deadline=None)
@given(calls=calls_strategy.filter(bool),
       ids=st.lists(st.from_regex(r"[A-Za-z0-9]{9}", fullmatch=True), min_size=4, max_size=4))
def test_mistral_keeps_call_ids(calls, ids):
    calls = [ToolCall(c.name, c.arguments, id=i) for c, i in zip(calls, ids, strict=False)]
    fmt = get_format("mistral")
    assert fmt.parse(fmt.render(calls)).calls == calls
