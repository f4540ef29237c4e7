"""The BFCL AST checker (toolrl.core.bfcl): unit cases and hypothesis properties."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from toolrl.core.bfcl import (
    check_call,
    check_calls,
    match_value,
    normalize_string,
    parse_ground_truth,
    tool_schemas,
)
from toolrl.core.types import ToolCall

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def tool(name, props, required=()):
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": list(required)}}}


# --- unit cases ------------------------------------------------------------------------------
def test_normalize_string_removes_exactly_the_bfcl_characters():
    assert normalize_string(" A,B.C/D-E_F*G^H ") == "abcdefgh"
    assert normalize_string("x:y;z!") == "x:y;z!"  # other punctuation is kept
    assert normalize_string("it's") == 'it"s'


def test_int_accepted_for_number_but_not_float_for_integer():
    schema = {"type": "object", "properties": {"x": {"type": "number"}, "n": {"type": "integer"}},
              "required": ["x", "n"]}
    gt = {"x": [2.0], "n": [3]}
    assert check_call(ToolCall("f", {"x": 2, "n": 3}), "f", gt, schema).valid
    bad = check_call(ToolCall("f", {"x": 2.0, "n": 3.0}), "f", gt, schema)
    assert not bad.valid and bad.error_type == "type_error" and "f.n" in bad.error


@pytest.mark.parametrize("value,typ", [(True, "integer"), (False, "number"), (1, "boolean"),
                                       (0.0, "boolean"), ("1", "integer"), (None, "string")])
def test_bools_never_ints_and_other_type_errors(value, typ):
    acceptable = {"integer": [1], "number": [0.0], "boolean": [True, False], "string": ["1"]}
    assert match_value(value, acceptable[typ], {"type": typ}) != ""


def test_optional_only_with_empty_string_marker():
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
              "required": []}
    assert check_call(ToolCall("f", {"a": "x"}), "f", {"a": ["x"], "b": ["y", ""]}, schema)
    res = check_call(ToolCall("f", {"b": "y"}), "f", {"a": ["x"], "b": ["y", ""]}, schema)
    assert res.error_type == "missing_param"


def test_required_unknown_and_answerless_params():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "z": {"type": "string"}},
              "required": ["a"]}
    gt = {"a": [1]}
    assert check_call(ToolCall("f", {}), "f", gt, schema).error_type == "missing_required"
    assert check_call(ToolCall("f", {"a": 1, "q": 1}), "f", gt,
                      schema).error_type == "unexpected_param"
    # in the schema but not in the possible answer: BFCL rejects it too
    assert check_call(ToolCall("f", {"a": 1, "z": "s"}), "f", gt,
                      schema).error_type == "unexpected_param"
    assert check_call(ToolCall("g", {"a": 1}), "f", gt, schema).error_type == "wrong_func_name"


def test_lists_are_order_sensitive_and_dicts_recursive():
    schema = {"type": "object", "properties": {
        "xs": {"type": "array", "items": {"type": "string"}},
        "d": {"type": "object", "properties": {"inner": {"type": "object", "properties": {
            "k": {"type": "integer"}}}}}}}
    gt = {"xs": [["New York", "LA"]], "d": [{"inner": [{"k": [1]}]}]}
    ok = ToolCall("f", {"xs": ["new york", "L.A."], "d": {"inner": {"k": 1}}})
    assert check_call(ok, "f", gt, schema).valid
    rev = ToolCall("f", {"xs": ["LA", "New York"], "d": {"inner": {"k": 1}}})
    assert not check_call(rev, "f", gt, schema).valid
    deep = check_call(ToolCall("f", {"xs": ["New York", "LA"], "d": {"inner": {"k": 1.0}}}),
                      "f", gt, schema)
    assert not deep.valid and "f.d.inner.k" in deep.error


def test_categories_and_counts():
    tools = [tool("f", {"a": {"type": "integer"}}, ["a"]), tool("g", {"s": {"type": "string"}})]
    f1, f2, g = {"name": "f", "arguments": {"a": 1}}, {"name": "f", "arguments": {"a": 2}}, \
        {"name": "g", "arguments": {"s": "x"}}
    gt_f1 = [{"f": {"a": [1]}}]
    assert check_calls([f1], gt_f1, "simple", tools).valid
    assert check_calls([f1, g], gt_f1, "multiple", tools).error_type == "wrong_count"
    gt_par = [{"f": {"a": [1]}}, {"f": {"a": [2]}}]
    assert check_calls([f2, f1], gt_par, "parallel", tools).valid
    assert not check_calls([f1, f1], gt_par, "parallel", tools).valid
    gt_pm = [{"f": {"a": [1]}}, {"g": {"s": ["X"]}}]
    assert check_calls([g, f1], gt_pm, "parallel_multiple", tools).valid
    assert check_calls([], [], "irrelevance", tools).valid
    assert not check_calls([g], [], "irrelevance", tools).valid
    # category inferred from the ground truth when absent
    assert check_calls([f2, f1], gt_par, None, tools).valid
    assert not check_calls([f1], [], None, tools).valid


def test_parallel_uses_a_full_matching_not_greedy():
    # expected #0 accepts both calls, expected #1 only the first: greedy in order would take the
    # first call for #0 and fail #1; a perfect matching exists.
    gt = [{"f": {"a": [1, 2]}}, {"f": {"a": [1]}}]
    tools = [tool("f", {"a": {"type": "integer"}}, ["a"])]
    calls = [{"name": "f", "arguments": {"a": 1}}, {"name": "f", "arguments": {"a": 2}}]
    assert check_calls(calls, gt, "parallel", tools).valid


def test_arguments_as_json_string_and_malformed_inputs():
    tools = [tool("f", {"a": {"type": "integer"}}, ["a"])]
    assert check_calls([{"name": "f", "arguments": json.dumps({"a": 1})}],
                       [{"f": {"a": [1]}}], "simple", tools).valid
    with pytest.raises(ValueError, match="not valid JSON"):
        check_calls([{"name": "f", "arguments": "{a: 1"}], [{"f": {"a": [1]}}], "simple", tools)
    with pytest.raises(ValueError, match="one-key object"):
        parse_ground_truth([{"f": {}, "g": {}}])
    with pytest.raises(ValueError, match="unknown BFCL category"):
        check_calls([], [], "live_simple", tools)
    with pytest.raises(ValueError, match="exactly one ground-truth call"):
        check_calls([], [{"f": {}}, {"f": {}}], "simple", tools)
    with pytest.raises(ValueError, match="OpenAI tool schema"):
        tool_schemas([{"type": "function"}])


def test_untyped_parameter_infers_type_from_answers():
    assert match_value(3, [3], None) == ""
    assert match_value("Three", ["three"], {}) == ""
    assert match_value(True, [1], None) != ""  # inferred number: a bool is not one


# --- properties ------------------------------------------------------------------------------
WORD = st.text(string.ascii_letters + string.digits, min_size=1, max_size=12)
NOISE = st.text(" ,./-_*^", max_size=3)
KEY = st.text(string.ascii_lowercase, min_size=1, max_size=6)


def typed_values(depth: int = 2):
    """(schema, value) pairs of every JSON type, nested arrays and objects included."""
    leaves = st.one_of(
        WORD.map(lambda s: ({"type": "string"}, s)),
        st.integers(-10**6, 10**6).map(lambda n: ({"type": "integer"}, n)),
        st.floats(-1e6, 1e6, allow_nan=False).map(lambda x: ({"type": "number"}, x)),
        st.booleans().map(lambda b: ({"type": "boolean"}, b)),
    )
    if depth == 0:
        return leaves
    inner = typed_values(depth - 1)
    arrays = inner.flatmap(lambda sv: st.lists(st.just(sv[1]), max_size=3).map(
        lambda xs, s=sv[0]: ({"type": "array", "items": s}, xs)))
    return st.one_of(leaves, arrays, typed_objects(depth))


def typed_objects(depth: int = 2):
    """(schema, dict value) pairs whose values may nest further."""
    return st.dictionaries(KEY, typed_values(depth - 1), min_size=1, max_size=3).map(lambda d: (
        {"type": "object", "properties": {k: sv[0] for k, sv in d.items()}},
        {k: sv[1] for k, sv in d.items()}))


def answer_of(value):
    """The possible-answer form of a concrete value (dicts as {key: [value]})."""
    if isinstance(value, dict):
        return {k: [answer_of(v)] for k, v in value.items()}
    if isinstance(value, list):
        return [answer_of(v) for v in value]
    return value


@given(typed_values())
@SETTINGS
def test_property_value_matches_its_own_answer(sv):
    schema, value = sv
    assert match_value(value, [answer_of(value)], schema) == ""


@given(WORD, st.lists(st.tuples(st.integers(0, 20), NOISE), max_size=4), st.randoms())
@SETTINGS
def test_property_string_normalization(word, inserts, rnd):
    noisy = "".join(c.upper() if rnd.random() < 0.5 else c.lower() for c in word)
    for pos, noise in inserts:
        pos = min(pos, len(noisy))
        noisy = noisy[:pos] + noise + noisy[pos:]
    assert match_value(noisy, [word], {"type": "string"}) == ""
    # changing one letter or digit (not just its case) breaks the match
    i = rnd.randrange(len(word))
    other = next(c for c in "q7z0" if c.lower() != word[i].lower())
    assert match_value(word[:i] + other + word[i + 1:], [word], {"type": "string"}) != ""


@given(st.integers(-10**6, 10**6))
@SETTINGS
def test_property_type_coercions(n):
    assert match_value(n, [float(n)], {"type": "number"}) == ""
    assert match_value(float(n), [n], {"type": "number"}) == ""
    assert match_value(float(n), [n], {"type": "integer"}) != ""
    assert match_value(str(n), [n], {"type": "integer"}) != ""
    assert match_value(bool(n % 2), [n % 2], {"type": "integer"}) != ""
    assert match_value(n % 2, [bool(n % 2)], {"type": "boolean"}) != ""


@given(st.lists(st.integers(-50, 50), min_size=2, max_size=5, unique=True), st.randoms())
@SETTINGS
def test_property_parallel_any_order_exact_count(values, rnd):
    tools = [tool("f", {"v": {"type": "integer"}, "tag": {"type": "string"}}, ["v"])]
    gt = [{"f": {"v": [v], "tag": ["t", ""]}} for v in values]
    calls = [{"name": "f", "arguments": {"v": v}} for v in values]
    rnd.shuffle(calls)
    for cat in ("parallel", "parallel_multiple"):
        assert check_calls(calls, gt, cat, tools).valid
        assert check_calls(calls[:-1], gt, cat, tools).error_type == "wrong_count"
        assert check_calls(calls + calls[:1], gt, cat, tools).error_type == "wrong_count"
        dup = calls[:-1] + calls[:1]
        assert not check_calls(dup, gt, cat, tools).valid


@given(st.dictionaries(KEY, st.tuples(st.integers(0, 9), st.booleans()), min_size=1,
                       max_size=6), st.randoms())
@SETTINGS
def test_property_optional_parameters(params, rnd):
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in params},
              "required": []}
    gt = {k: [v, ""] if optional else [v] for k, (v, optional) in params.items()}
    full = {k: v for k, (v, _) in params.items()}
    assert check_call(ToolCall("f", full), "f", gt, schema).valid
    omitted = {k for k in params if rnd.random() < 0.5}
    args = {k: v for k, v in full.items() if k not in omitted}
    should_pass = all(params[k][1] for k in omitted)
    assert check_call(ToolCall("f", args), "f", gt, schema).valid == should_pass


def shuffled(value, rnd):
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


def nested_dicts(value):
    """Paths (tuples of keys) to every dict inside value that is reachable through dicts."""
    out = []
    if isinstance(value, dict):
        out.append(())
        for k, v in value.items():
            out += [(k, *p) for p in nested_dicts(v)]
    return out


@given(typed_objects(depth=3), st.randoms())
@SETTINGS
def test_property_nested_dicts(sv, rnd):
    schema, value = sv
    gt = [answer_of(value)]
    assert match_value(shuffled(value, rnd), gt, schema) == ""
    path = rnd.choice(nested_dicts(value))
    extra = json.loads(json.dumps(value))
    target = extra
    for k in path:
        target = target[k]
    new_key = "zz_extra"
    assume(new_key not in target)
    target[new_key] = 1
    assert match_value(extra, gt, schema) != ""
    missing = json.loads(json.dumps(value))
    target = missing
    for k in path:
        target = target[k]
    del target[next(iter(target))]  # no "" among its answers: a missing key fails
    assert match_value(missing, gt, schema) != ""


@given(st.lists(st.fixed_dictionaries({"name": WORD, "arguments": st.dictionaries(
    KEY, st.integers())}), min_size=1, max_size=3))
@SETTINGS
def test_property_irrelevance_fails_any_call(calls):
    tools = [tool("f", {"a": {"type": "integer"}})]
    assert check_calls(calls, [], "irrelevance", tools).error_type == "wrong_count"
    assert check_calls([], [], "irrelevance", tools).valid


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8)


@given(st.lists(st.fixed_dictionaries({"name": st.sampled_from(["f", "g"]),
                                        "arguments": st.dictionaries(KEY, JSON, max_size=3)}),
                max_size=3),
       st.sampled_from(["simple", "parallel", "parallel_multiple", "irrelevance", None]))
@SETTINGS
def test_property_arbitrary_candidates_never_raise(calls, category):
    tools = [tool("f", {"a": {"type": "integer"}, "b": {"type": "array"}}, ["a"]),
             tool("g", {"o": {"type": "object"}})]
    gt = [{"f": {"a": [1], "b": [[1, "x"], ""]}}]
    if category in ("parallel", "parallel_multiple"):
        gt = [*gt, {"g": {"o": [{"k": ["v"]}]}}]
    if category == "irrelevance":
        gt = []
    res = check_calls(calls, gt, category, tools)
    assert isinstance(res.valid, bool) and (res.valid or res.error)
