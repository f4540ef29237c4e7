"""The BFCL AST checker (toolrl.core.bfcl): unit cases and hypothesis properties."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from toolrl.core.bfcl import (
    BFCL_CATEGORIES,
    SCORABLE,
    category_of,
    check_call,
    check_calls,
    check_mode,
    check_param,
    check_parsed,
    ground_truth_calls,
    match_value,
    normalize_string,
    parse_ground_truth,
    possible_answer,
    tool_schemas,
)
from toolrl.core.types import ParseError, ParseResult, ToolCall

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


def test_int_accepted_for_float_but_not_float_for_integer():
    schema = {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "float"},
                                               "n": {"type": "integer"}},
              "required": ["x", "n"]}
    gt = {"x": [2.0], "y": [0.5, ""], "n": [3]}
    assert check_call(ToolCall("f", {"x": 2, "n": 3}), "f", gt, schema).valid
    bad = check_call(ToolCall("f", {"x": 2.0, "n": 3.0}), "f", gt, schema)
    assert not bad.valid and bad.error_type == "type_error:simple"
    assert "parameter 'n'" in bad.error and bad.error.startswith("f: ")


@pytest.mark.parametrize("value,typ", [(True, "integer"), (False, "number"), (1, "boolean"),
                                       (0.0, "boolean"), ("1", "integer"), (None, "string")])
def test_bools_never_ints_and_other_type_errors(value, typ):
    acceptable = {"integer": [1], "number": [0.0], "boolean": [True, False], "string": ["1"]}
    assert match_value(value, acceptable[typ], {"type": typ}) != ""


def test_variable_answers_accept_the_answer_type_compared_as_is():
    """BFCL: when the answers are of another type than the schema's, a value of the answers'
    type is accepted and compared as is (no string normalization)."""
    schema = {"type": "integer"}
    assert match_value("user_id", ["user_id"], schema) == ""  # a variable name for an int
    assert match_value("User_ID", ["user_id"], schema) != ""  # compared as is: case counts
    assert match_value(7, ["user_id"], schema) != ""  # the schema's type: compared as is too
    flag = {"type": "string"}
    assert match_value(True, [True], flag) == ""  # a string parameter whose answer is true
    assert match_value("true", [True], flag) != ""  # ... is not matched by the string
    assert match_value("True", [True], flag) != ""
    assert match_value(1, [True], flag) != ""  # an int is neither type
    doc = {"type": "dict", "properties": {"k": {"type": "string"}}}
    assert match_value("my_dict", ["my_dict"], doc) == ""  # a variable holding a dict
    verdict = check_param("d", {"k": "v"}, ["my_dict"], doc)
    assert verdict.error_type == "value_error:others"  # a dict against a variable: as is


def test_listed_null_is_accepted_and_compared_as_is():
    for typ in ("string", "integer", "float", "boolean", "array", "dict"):
        schema = {"type": typ}
        assert match_value(None, ["", None], schema) == "", typ
        assert match_value(None, [None], schema) == "", typ
    assert match_value(None, ["x", None], {"type": "string"}) != ""  # BFCL: the first answer's
    # type decides (str here), so null is a type error when a string is listed first
    assert match_value("", ["", None], {"type": "string"}) == ""  # BFCL: "" is among the values
    assert match_value("x", ["", None], {"type": "string"}) != ""  # compared as is: no match
    assert match_value(None, ["x"], {"type": "string"}) != ""  # null not listed: type error
    call = ToolCall("f", {"a": None})
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert check_call(call, "f", {"a": ["", None]}, schema).valid
    assert check_call(ToolCall("f", {}), "f", {"a": ["", None]}, schema).valid


def test_arrays_check_item_types_one_level_like_bfcl():
    floats = {"type": "array", "items": {"type": "float"}}
    assert match_value([1.5, 2.0], [[1.5, 2.0]], floats) == ""
    bad = check_param("xs", [1, 2], [[1.0, 2.0]], floats)
    assert bad.error_type == "type_error:nested"  # items are not converted from int
    assert match_value([1, 2], ["", [1.0, 2.0]], floats) == ""  # BFCL: "" first skips the check
    strings = {"type": "array", "items": {"type": "string"}}
    assert match_value(["New York", "L.A."], [["new york", "LA"]], strings) == ""
    assert match_value(["LA", "New York"], [["New York", "LA"]], strings) != ""  # ordered
    assert match_value([], ["", ["a"]], strings) == ""  # BFCL reads "" as the empty list


def test_dicts_one_level_and_lists_of_dicts():
    doc = {"type": "dict", "properties": {"size": {"type": "string"}, "n": {"type": "integer"}}}
    answer = [{"size": ["Large", "big"], "n": [2], "note": ["", "x"]}]
    assert match_value({"size": "large", "n": 2}, answer, doc) == ""
    assert match_value({"size": "big", "n": 2.0}, answer, doc) == ""  # values: == (2 == 2.0)
    assert check_param("d", {"size": "large"}, answer, doc).error_type == "value_error:dict_key"
    assert check_param("d", {"size": "large", "n": 2, "z": 1}, answer,
                       doc).error_type == "value_error:dict_key"
    assert check_param("d", {"size": "small", "n": 2}, answer,
                       doc).error_type == "value_error:dict_value"
    rows = {"type": "array", "items": {"type": "dict"}}
    answer = [[{"a": [1]}, {"a": [2, 3]}]]
    assert match_value([{"a": 1}, {"a": 3}], answer, rows) == ""
    assert match_value([{"a": 3}, {"a": 1}], answer, rows) != ""
    assert check_param("r", [{"a": 1}], answer, rows).error_type == "value_error:list_dict_count"
    # a dict nested in a dict: BFCL compares it by equality; toolrl also reads it in
    # possible-answer form (BFCL's data has none)
    nested = [{"outer": [{"inner": 1}]}]
    assert match_value({"outer": {"inner": 1}}, nested, doc) == ""
    assert match_value({"outer": {"inner": 2}}, [{"outer": [{"inner": [1, 2]}]}], doc) == ""


def test_optional_only_with_empty_string_marker():
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
              "required": []}
    assert check_call(ToolCall("f", {"a": "x"}), "f", {"a": ["x"], "b": ["y", ""]}, schema)
    res = check_call(ToolCall("f", {"b": "y"}), "f", {"a": ["x"], "b": ["y", ""]}, schema)
    assert res.error_type == "simple_function_checker:missing_optional"


def test_required_unknown_and_answerless_params():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "z": {"type": "string"}},
              "required": ["a"]}
    gt = {"a": [1]}
    code = "simple_function_checker:"
    assert check_call(ToolCall("f", {}), "f", gt, schema).error_type == code + "missing_required"
    assert check_call(ToolCall("f", {"a": 1, "q": 1}), "f", gt,
                      schema).error_type == code + "unexpected_param"
    # in the schema but not in the possible answer: BFCL rejects it too
    assert check_call(ToolCall("f", {"a": 1, "z": "s"}), "f", gt,
                      schema).error_type == code + "unexpected_param"
    assert check_call(ToolCall("g", {"a": 1}), "f", gt,
                      schema).error_type == code + "wrong_func_name"


def test_categories_and_counts():
    tools = [tool("f", {"a": {"type": "integer"}}, ["a"]), tool("g", {"s": {"type": "string"}})]
    f1, f2, g = {"name": "f", "arguments": {"a": 1}}, {"name": "f", "arguments": {"a": 2}}, \
        {"name": "g", "arguments": {"s": "x"}}
    gt_f1 = [{"f": {"a": [1]}}]
    for cat in ("simple", "simple_python", "live_simple"):
        assert check_calls([f1], gt_f1, cat, tools).valid
        assert check_calls([f1, f1], gt_f1, cat,
                           tools).error_type == "simple_function_checker:wrong_count"
    for cat in ("multiple", "live_multiple"):
        assert check_calls([f1, g], gt_f1, cat,
                           tools).error_type == "multiple_function_checker:wrong_count"
    gt_par = [{"f": {"a": [1]}}, {"f": {"a": [2]}}]
    for cat in ("parallel", "live_parallel", "parallel_multiple", "live_parallel_multiple"):
        assert check_calls([f2, f1], gt_par, cat, tools).valid
        assert check_calls([f1, f1], gt_par, cat, tools).error_type == \
            "parallel_function_checker_no_order:cannot_find_match"
        assert check_calls([f1], gt_par, cat, tools).error_type == \
            "parallel_function_checker_no_order:wrong_count"
    gt_pm = [{"f": {"a": [1]}}, {"g": {"s": ["X"]}}]
    assert check_calls([g, f1], gt_pm, "parallel_multiple", tools).valid
    for cat in ("irrelevance", "live_irrelevance"):
        assert check_calls([], [], cat, tools).valid
        assert check_calls([g], [], cat, tools).error_type == "irrelevance_error:decoder_success"
    for cat in ("relevance", "live_relevance"):  # any well-formed call, right or not
        assert check_calls([g], [], cat, tools).valid
        assert check_calls([{"name": "nope", "arguments": {}}], [], cat, tools).valid
        assert check_calls([], [], cat, tools).error_type == "relevance_error:decoder_failed"
    # category inferred from the ground truth when absent
    assert check_calls([f2, f1], gt_par, None, tools).valid
    assert not check_calls([f1], [], None, tools).valid
    assert category_of(0, 3) == "irrelevance" and category_of(1, 1) == "simple"
    assert category_of(1, 2) == "multiple" and category_of(2, 1) == "parallel"
    assert category_of(3, 2) == "parallel_multiple"


@pytest.mark.parametrize("category,why", [
    ("multi_turn_base", "multi-turn"), ("memory_kv", "memory"), ("web_search_base", "search"),
    ("format_sensitivity", "not a scoring"), ("live_simple_0", "unknown BFCL category"),
    ("restaurant", "unknown BFCL category")])
def test_categories_toolrl_cannot_score_are_clear_errors(category, why):
    with pytest.raises(ValueError, match=why):
        check_mode(category)
    with pytest.raises(ValueError, match=why):
        check_calls([], [{"f": {}}], category, [])
    assert set(BFCL_CATEGORIES) <= set(SCORABLE)


def test_decode_is_all_or_nothing_like_bfcl():
    tools = [tool("f", {"a": {"type": "integer"}}, ["a"])]
    good = ParseResult(calls=[ToolCall("f", {"a": 1})], text="")
    broken = ParseResult(calls=[ToolCall("f", {"a": 1})], text="",
                         errors=[ParseError("invalid_json", "bad")])
    gt = [{"f": {"a": [1]}}]
    assert check_parsed([good], gt, "simple", tools).valid
    assert check_parsed([broken], gt, "simple", tools).error_type == "ast_decoder:decoder_failed"
    assert check_parsed([broken], gt, "simple", tools, strict_parse=False).valid
    # irrelevance: output that does not decode is no call, even with a good call inside
    assert check_parsed([broken], [], "irrelevance", tools).valid
    assert not check_parsed([broken], [], "irrelevance", tools, strict_parse=False).valid
    assert check_parsed([broken], [], "live_relevance",
                        tools).error_type == "relevance_error:decoder_failed"
    assert check_parsed([good], [], "live_relevance", tools).valid


def test_parallel_uses_a_full_matching_not_greedy():
    # expected #0 accepts both calls, expected #1 only the first: greedy in order (BFCL) takes
    # the first call for #0 and fails #1; a perfect matching exists (the intended difference).
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
    with pytest.raises(ValueError, match="exactly one ground-truth call"):
        check_calls([], [{"f": {}}, {"f": {}}], "simple", tools)
    with pytest.raises(ValueError, match="OpenAI tool schema"):
        tool_schemas([{"type": "function"}])


def test_untyped_parameter_infers_type_from_answers():
    assert match_value(3, [3], None) == ""
    assert match_value("Three", ["three"], {}) == ""
    assert match_value(True, [1], None) != ""  # typed int by its answer: a bool is not one
    assert match_value({"k": "V"}, [{"k": ["v"]}], {"description": "no type"}) == ""


def test_json_schema_unions_and_names():
    either = {"type": ["string", "null"]}
    assert match_value(None, ["x"], either) != ""  # null not listed
    assert match_value("X", ["x"], either) == ""
    assert match_value(3, [3.0], {"type": "number"}) == ""
    assert match_value({"k": 1}, [{"k": [1]}], {"type": "object"}) == ""


def test_ground_truth_calls_pass_and_omit_what_may_be_omitted():
    tools = [tool("f", {"a": {"type": "integer"}, "b": {"type": "string"},
                        "c": {"type": "string"}, "d": {"type": "dict"},
                        "rows": {"type": "array", "items": {"type": "dict"}}}, ["a", "c"])]
    gt = [{"f": {"a": [1], "b": ["", "x"], "c": ["", "must"], "d": [{"k": ["v", "w"], "o": [""]}],
                 "rows": [[{"n": [1, 2]}]]}}]
    [call] = ground_truth_calls(gt, tools)
    assert call.arguments == {"a": 1, "c": "must", "d": {"k": "v"}, "rows": [{"n": 1}]}
    assert check_calls([call], gt, "simple", tools).valid
    assert ground_truth_calls([], tools) == []


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


@given(typed_values(), st.randoms())
@SETTINGS
def test_property_a_call_passes_its_own_possible_answer(sv, rnd):
    """possible_answer(call) accepts the call, and ground_truth_calls gives the call back."""
    schema, value = sv
    tools = [tool("f", {"x": schema}, ["x"])]
    call = ToolCall("f", {"x": value})
    answer = possible_answer(call, tool_schemas(tools)["f"])
    assert check_calls([call], [answer], "simple", tools).valid
    assert check_calls([ToolCall("f", {"x": shuffled(value, rnd)})], [answer], "simple",
                       tools).valid
    assert ground_truth_calls([answer], tools) == [call]


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
        wrong_count = "parallel_function_checker_no_order:wrong_count"
        assert check_calls(calls[:-1], gt, cat, tools).error_type == wrong_count
        assert check_calls(calls + calls[:1], gt, cat, tools).error_type == wrong_count
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
    """A dict parameter: keys in any order; an extra or a missing key anywhere fails."""
    schema, value = sv
    gt = [{k: [v] for k, v in value.items()}]  # possible-answer form at BFCL's one level
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
    assert check_calls(calls, [], "irrelevance",
                       tools).error_type == "irrelevance_error:decoder_success"
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


# --- the function name comes from the offered functions, as in BFCL --------------------------
TRIANGLE = tool("calculate_triangle_area", {"base": {"type": "integer"},
                                            "height": {"type": "integer"}}, ["base", "height"])
SHIFTED = [{"math.factorial": {"number": [5]}}]  # another row's answer (ids shifted)


def test_a_call_to_a_function_the_row_does_not_offer_scores_0_with_that_reason():
    """BFCL's simple_function_checker takes the name from func_description[0]: a shifted
    ground truth cannot make a call of an unoffered function pass."""
    from toolrl import Trajectory, TurnRecord
    from toolrl.reward.api import get_reward_spec

    verdict = check_calls([ToolCall("math.factorial", {"number": 5})], SHIFTED,
                          "simple_python", [TRIANGLE])
    assert not verdict.valid and verdict.error_type == "toolrl:function_not_offered"
    assert "'math.factorial' is not among the functions offered (calculate_triangle_area)" in \
        verdict.error
    # the offered function is the one checked, against the possible answer's parameters
    verdict = check_calls([ToolCall("calculate_triangle_area", {"base": 3, "height": 4})],
                          SHIFTED, "simple_python", [TRIANGLE])
    assert not verdict.valid and verdict.error_type == "simple_function_checker:unexpected_param"
    # in multiple and parallel categories the possible answer's function must be offered
    for category in ("multiple", "parallel"):
        verdict = check_calls([ToolCall("calculate_triangle_area", {"base": 3, "height": 4})],
                              SHIFTED, category, [TRIANGLE])
        assert not verdict.valid and "'math.factorial', which is not among the functions " \
            "offered" in verdict.error, category
    # the reward says so too
    row = {"id": "simple_python_1", "category": "simple_python", "tools": [TRIANGLE],
           "ground_truth": SHIFTED}
    traj = Trajectory(row=row)
    traj.turns.append(TurnRecord(action="", parse=ParseResult(
        calls=[ToolCall("math.factorial", {"number": 5})], text="")))
    result = get_reward_spec("bfcl_ast").target(traj)
    assert result.score == 0.0 and "not among the functions offered" in result.reason


# --- Java and JavaScript: arguments are source code, converted by BFCL's own converters ------
JAVA_FN = {"name": "Cache.put", "description": "d", "parameters": {"type": "dict", "properties": {
    "key": {"type": "String"}, "ttl": {"type": "long"}, "ratio": {"type": "float"},
    "tags": {"type": "ArrayList", "items": {"type": "String"}},
    "meta": {"type": "HashMap"}, "on": {"type": "boolean"}}, "required": ["key", "ttl"]}}
JAVA_TRUTH = [{"Cache.put": {"key": ["user"], "ttl": [5], "ratio": [0.5, ""],
                             "tags": [["a", "b"]], "meta": [{"k": ["v"]}], "on": [True, ""]}}]


@pytest.mark.parametrize("arguments,valid,error_type", [
    ({"key": "user", "ttl": "5L", "ratio": "0.5f", "tags": 'new ArrayList<>(Arrays.asList("a", '
      '"b"))', "meta": 'new HashMap<String, String>() {{ put("k", "v"); }}', "on": "true"},
     True, ""),
    ({"key": "user", "ttl": "5", "tags": 'new ArrayList<>(Arrays.asList("a", "b"))',
      "meta": 'new HashMap<String, String>() {{ put("k", "v"); }}'}, False, "type_error:simple"),
    ({"key": "user", "ttl": 5, "tags": "x", "meta": "y"}, False, "type_error:java"),
    ({"key": '"user"', "ttl": "5L", "tags": 'new ArrayList<>(Arrays.asList("a", "b"))',
      "meta": 'new HashMap<String, String>() {{ put("k", "v"); }}'}, False, "value_error:string"),
    ({"key": "user", "ttl": "5L", "tags": 'new ArrayList<>(Arrays.asList("b", "a"))',
      "meta": 'new HashMap<String, String>() {{ put("k", "v"); }}'}, False,
     "value_error:list/tuple"),
])
def test_java_arguments_are_source_code_read_by_bfcls_converter(arguments, valid, error_type):
    tools = [{"type": "function", "function": JAVA_FN}]
    result = check_calls([{"name": "Cache.put", "arguments": arguments}], JAVA_TRUTH,
                         "simple_java", tools)
    assert (result.valid, result.error_type) == (valid, error_type), result.error


def test_javascript_and_the_calls_that_stand_for_an_answer():
    from toolrl.core.bfcl import ground_truth_calls, presented_tools

    fn = {"name": "track", "description": "d", "parameters": {"type": "dict", "properties": {
        "id": {"type": "Bigint"}, "names": {"type": "array", "items": {"type": "String"}},
        "opts": {"type": "dict", "properties": {"deep": {"type": "Boolean"}}}},
        "required": ["id"]}}
    truth = [{"track": {"id": [12], "names": [["x", "y"]], "opts": [{"deep": [True]}]}}]
    tools = [{"type": "function", "function": fn}]
    calls = ground_truth_calls(truth, tools, "simple_javascript")
    assert calls[0].arguments == {"id": "12n", "names": '["x", "y"]', "opts": "{deep: true}"}
    assert check_calls(calls, truth, "simple_javascript", tools).valid
    wrong = [{"name": "track", "arguments": {**calls[0].arguments, "id": "12"}}]
    assert check_calls(wrong, truth, "simple_javascript", tools).error_type == \
        "type_error:simple"
    shown = presented_tools(tools, "javascript")[0]["function"]["parameters"]
    assert {p["type"] for p in shown["properties"].values()} == {"string"}
    assert "This is JavaScript Bigint type parameter" in shown["properties"]["id"]["description"]
    assert "deep" in shown["properties"]["opts"]["description"]  # dict schema moved to prose
    with pytest.raises(ValueError, match="needs the row's tools"):
        check_calls(calls, truth, "simple_javascript", None)
