"""Every built-in reward: unit cases and hypothesis properties."""

from __future__ import annotations

import math
import string

import pytest
import toolrl.rewards  # noqa: F401  (registers the built-ins, as the entry point does)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolrl.core.parse import get_format
from toolrl.core.trajectory import Trajectory, TurnRecord
from toolrl.core.types import ParseError, ParseResult, ToolCall
from toolrl.reward import REWARDS, RewardConfigError, RewardResult, make_reward

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BUILTINS = ["answer_match", "bfcl_ast", "exec_state", "format", "length_penalty", "remote",
            "success", "tool_error_penalty", "toolcall_fine", "turn_penalty"]


def score(name, traj, **kwargs) -> RewardResult:
    import asyncio

    from toolrl.reward import to_result

    return to_result(asyncio.run(make_reward(name, **kwargs).one(traj)))


def tool(name, props, required=()):
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": list(required)}}}


def traj_of(turns, row=None, tools=(), **kw) -> Trajectory:
    """turns: list of (calls, errors, repaired) or ParseResult."""
    built = []
    for t in turns:
        if isinstance(t, ParseResult):
            built.append(TurnRecord(parse=t))
        else:
            calls, errors, repaired = t
            built.append(TurnRecord(parse=ParseResult(calls=[ToolCall(n, a) for n, a in calls],
                                                text="", errors=errors, repaired=repaired)))
    return Trajectory(turns=built, row=dict(row or {}), tools=list(tools), **kw)


def test_every_builtin_is_registered_through_the_package():
    assert set(BUILTINS) <= set(REWARDS.names())
    for name in BUILTINS:
        assert REWARDS.get(name).description, name


# --- bfcl_ast --------------------------------------------------------------------------------
WEATHER = [tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}},
                ["city"])]


def test_bfcl_ast_scores_and_explains():
    row = {"id": "w1", "category": "simple",
           "ground_truth": [{"get_weather": {"city": ["Paris"], "days": [3, ""]}}]}
    good = traj_of([([("get_weather", {"city": "paris"})], [], False)], row, WEATHER)
    assert score("bfcl_ast", good).score == 1.0
    bad = traj_of([([("get_weather", {"city": "Paris", "days": 3.0})], [], False)], row, WEATHER)
    res = score("bfcl_ast", bad)
    assert res.score == 0.0 and "days" in res.reason


def test_bfcl_ast_parse_errors():
    row = {"category": "simple", "ground_truth": [{"get_weather": {"city": ["Paris"]}}]}
    err = [ParseError("invalid_json", "bad")]
    t = traj_of([([("get_weather", {"city": "Paris"})], err, False)], row, WEATHER)
    assert score("bfcl_ast", t).score == 0.0
    assert score("bfcl_ast", t, strict_parse=False).score == 1.0
    irr = traj_of([([], err, False)], {"category": "irrelevance", "ground_truth": []}, WEATHER)
    assert score("bfcl_ast", irr).score == 1.0  # undecodable output is no call (as in BFCL)


def test_bfcl_ast_needs_ground_truth():
    with pytest.raises(ValueError, match="ground_truth"):
        score("bfcl_ast", traj_of([([], [], False)], {}))


@given(st.lists(st.text(string.ascii_letters, min_size=1, max_size=8), min_size=1, max_size=4,
                unique_by=str.lower), st.randoms())
@SETTINGS
def test_property_bfcl_ast_parallel_permutations_across_turns(cities, rnd):
    row = {"category": "parallel",
           "ground_truth": [{"get_weather": {"city": [c], "days": [""]}} for c in cities]}
    calls = [("get_weather", {"city": c.upper()}) for c in cities]
    rnd.shuffle(calls)
    cut = rnd.randrange(len(calls) + 1)  # calls split over two turns still count together
    t = traj_of([(calls[:cut], [], False), (calls[cut:], [], False)], row, WEATHER)
    assert score("bfcl_ast", t).score == 1.0
    t2 = traj_of([(calls[1:], [], False)], row, WEATHER)
    assert score("bfcl_ast", t2).score == 0.0


# --- toolcall_fine ---------------------------------------------------------------------------
def test_toolcall_fine_hand_computed_example():
    # GT f(a=1, b="x"); prediction f(a=1, c=2): names 1, params |{a}|/|{a,b,c}| = 1/3,
    # values 1 (a) -> 7/3 of max 1 + 1 + 2 = 4 -> -3 + 6 * 7/12 = 0.5; clean format +1.
    row = {"ground_truth": [{"f": {"a": [1], "b": ["x"]}}]}
    t = traj_of([([("f", {"a": 1, "c": 2})], [], False)], row)
    res = score("toolcall_fine", t)
    assert res.components["correct"] == pytest.approx(0.5)
    assert res.components["format"] == 1.0 and res.score == pytest.approx(1.5)


def test_toolcall_fine_frequency_aware_names_and_best_unused_match():
    row = {"ground_truth": [{"f": {"a": [1]}}, {"f": {"a": [2]}}, {"g": {}}]}
    # names: G={f:2, g:1}, P={f:1, h:1} -> min sum 1 / max sum 4 = 0.25
    t = traj_of([([("f", {"a": 2}), ("h", {})], [], False)], row)
    res = score("toolcall_fine", t, format_score=0.0)
    assert res.components["name"] == pytest.approx(0.25)
    # the single f call is used by the first GT call (best unused): jaccard 1, value 0
    assert res.components["param"] == pytest.approx(1.0)
    assert res.components["value"] == pytest.approx(0.0)


def test_toolcall_fine_optional_params_and_value_modes():
    row = {"ground_truth": [{"f": {"city": ["Paris"], "unit": ["c", ""]}}]}
    t = traj_of([([("f", {"city": "paris"})], [], False)], row,
                [tool("f", {"city": {"type": "string"}, "unit": {"type": "string"}})])
    exact = score("toolcall_fine", t, format_score=0.0)
    bfcl = score("toolcall_fine", t, format_score=0.0, value_match="bfcl")
    assert exact.components["param"] == 1.0  # omitted optional costs nothing
    assert exact.components["value"] == 0.0 and bfcl.components["value"] == 1.0
    assert bfcl.score == pytest.approx(3.0)


def test_toolcall_fine_bools_are_not_numbers_and_config_is_validated():
    row = {"ground_truth": [{"f": {"a": [1]}}]}
    t = traj_of([([("f", {"a": True})], [], False)], row)
    assert score("toolcall_fine", t).components["value"] == 0.0
    with pytest.raises(ValueError, match="low < high"):
        make_reward("toolcall_fine", low=1, high=1)
    with pytest.raises(RewardConfigError, match="Valid kwargs: low"):
        make_reward("toolcall_fine", lo=1)


GT_CALLS = st.lists(st.tuples(st.sampled_from("fgh"), st.dictionaries(
    st.sampled_from("abcd"), st.integers(0, 3), max_size=3)), max_size=4)


@given(GT_CALLS, GT_CALLS, st.floats(-5, 0), st.floats(0.5, 5), st.randoms())
@SETTINGS
def test_property_toolcall_fine_range_perfect_and_permutation(gt, pred, low, high, rnd):
    row = {"ground_truth": [{n: {k: [v] for k, v in a.items()}} for n, a in gt]}
    res = score("toolcall_fine", traj_of([(pred, [], False)], row), low=low, high=high,
                format_score=0.0)
    assert low - 1e-9 <= res.score <= high + 1e-9
    perfect = score("toolcall_fine", traj_of([(gt, [], False)], row), low=low, high=high,
                    format_score=0.0)
    assert perfect.score == pytest.approx(high)
    if gt:
        empty = score("toolcall_fine", traj_of([([], [], False)], row), low=low, high=high,
                      format_score=0.0)
        assert empty.score == pytest.approx(low)
    if len({n for n, _ in pred}) == len(pred):  # distinct names: order cannot matter
        shuffled = list(pred)
        rnd.shuffle(shuffled)
        again = score("toolcall_fine", traj_of([(shuffled, [], False)], row), low=low,
                      high=high, format_score=0.0)
        assert again.score == pytest.approx(res.score)


@given(st.dictionaries(st.sampled_from("abcde"), st.integers(0, 5), min_size=1, max_size=5),
       st.data())
@SETTINGS
def test_property_toolcall_fine_wrong_value_never_helps(args, data):
    row = {"ground_truth": [{"f": {k: [v] for k, v in args.items()}}]}
    right = score("toolcall_fine", traj_of([([("f", args)], [], False)], row)).score
    key = data.draw(st.sampled_from(sorted(args)))
    wrong = score("toolcall_fine", traj_of([([("f", {**args, key: args[key] + 1})], [], False)],
                                           row)).score
    assert wrong < right


# --- format ----------------------------------------------------------------------------------
def test_format_penalties_per_turn():
    tools = [tool("add", {"a": {"type": "integer"}})]
    t = traj_of([([("add", {"a": 1})], [], False),                    # clean
                 ([("add", {"a": 1})], [], True),                     # repaired
                 ([("nope", {})], [], False),                         # unknown tool
                 ([], [ParseError("unclosed_tag", "no </tool_call>")], False)], tools=tools)
    res = score("format", t)
    assert res.per_turn == [1.0, 0.5, 0.0, 0.0]
    assert res.score == pytest.approx(1.5 / 4)
    assert "unknown tool" in res.reason and "unclosed_tag" in res.reason
    assert score("format", t, reduce="min").score == 0.0
    assert score("format", traj_of([])).score == 0.0
    with pytest.raises(ValueError, match="reduce"):
        make_reward("format", reduce="max")


def test_format_pays_for_a_call_where_one_is_expected_not_for_prose():
    tools = [tool("add", {"a": {"type": "integer"}})]
    prose = [([], [], False)]  # an answer without a call: a well-formed turn, but no call
    assert score("format", traj_of(prose, tools=tools)).score == 0.0
    res = score("format", traj_of(prose, row={"ground_truth": [{"add": {"a": [1]}}]},
                                  tools=tools), no_call_score=0.25)
    assert res.score == 0.25 and res.per_turn == [0.25] and "no tool call" in res.reason
    # BFCL irrelevance (no offered function fits: an empty ground truth): prose is right
    assert score("format", traj_of(prose, row={"ground_truth": []}, tools=tools)).score == 1.0
    assert score("format", traj_of(prose)).score == 1.0  # no tools offered: no call expected
    # a call, then a closing answer in prose: the call is there, both turns are well formed
    assert score("format", traj_of([([("add", {"a": 1})], [], False), *prose],
                                   tools=tools)).score == 1.0


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=1,
                max_size=6))
@SETTINGS
def test_property_format_bounded_and_monotone(flags):
    tools = [tool("add", {})]
    turns = [([("add" if known else "zzz", {})], [ParseError("invalid_json", "x")] if err else [],
              rep) for err, known, rep in flags]
    res = score("format", traj_of(turns, tools=tools))
    assert all(0.0 <= x <= 1.0 for x in res.per_turn) and 0.0 <= res.score <= 1.0
    assert (res.score == 1.0) == all(not e and k and not r for e, k, r in flags)


# --- exec_state ------------------------------------------------------------------------------
STATE = st.recursive(st.integers(-5, 5) | st.text("ab", max_size=2) | st.booleans(),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text("xyz", min_size=1, max_size=2), inner, max_size=3),
                     max_leaves=10)


def test_exec_state_exact_partial_keys_and_tolerance():
    expected = {"accounts": {"a1": 100.0, "a2": 5.0}, "log": ["t1"], "n": 1}
    row = {"expected_state": expected}
    same = Trajectory(row=row, final_state={"n": 1, "log": ["t1"],
                                            "accounts": {"a2": 5.0, "a1": 100.0 + 1e-12}})
    assert score("exec_state", same).score == 1.0
    off = Trajectory(row=row, final_state={**expected, "accounts": {"a1": 90.0, "a2": 5.0}})
    res = score("exec_state", off)
    assert res.score == 0.0 and "state.accounts.a1" in res.reason
    assert score("exec_state", off, partial=True).score == pytest.approx(2 / 3)
    assert score("exec_state", off, ignore=["accounts"]).score == 1.0
    assert score("exec_state", off, keys=["log", "n"]).score == 1.0
    flag = Trajectory(row={"expected_state": {"ok": 1}}, final_state={"ok": True})
    assert score("exec_state", flag).score == 0.0  # a bool is not the int 1
    with pytest.raises(ValueError, match="final_state"):
        score("exec_state", Trajectory(row=row))


@given(st.dictionaries(st.text("pq", min_size=1, max_size=2), STATE, min_size=1, max_size=4),
       st.randoms())
@SETTINGS
def test_property_exec_state(state, rnd):
    import copy

    def reorder(v):
        if isinstance(v, dict):
            items = list(v.items())
            rnd.shuffle(items)
            return {k: reorder(x) for k, x in items}
        return [reorder(x) for x in v] if isinstance(v, list) else v

    row = {"expected_state": state}
    assert score("exec_state", Trajectory(row=row, final_state=reorder(copy.deepcopy(state)))
                 ).score == 1.0
    changed = copy.deepcopy(state)
    key = rnd.choice(sorted(changed))
    changed[key] = {"__changed__": [changed[key]]}
    assert score("exec_state", Trajectory(row=row, final_state=changed)).score == 0.0


# --- answer_match / success ------------------------------------------------------------------
def test_answer_match_sources():
    row = {"answer": 42}
    sub = traj_of([([("add", {"a": 40, "b": 2})], [], False), ([("submit", {"answer": "42.0"})],
                                                              [], False)], row)
    assert score("answer_match", sub).score == 1.0
    text = Trajectory(messages=[{"role": "assistant", "content": "So it is 4.2e1, I think."}],
                      turns=[TurnRecord(parse=ParseResult(calls=[], text=""))], row=row)
    assert score("answer_match", text).score == 1.0
    assert score("answer_match", text, from_text=False).reason == "no answer submitted"
    word = Trajectory(messages=[{"role": "assistant", "content": "  Paris "}], row={"answer":
                                                                                   "paris"})
    assert score("answer_match", word).score == 1.0
    wrong = traj_of([([("submit", {"answer": 41})], [], False)], row)
    assert score("answer_match", wrong).score == 0.0


@given(st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from(["{:g}", "{:.10f}", "{!r}",
                                                                "{:e}"]))
@SETTINGS
def test_property_answer_match_numeric_formats(x, fmt):
    row = {"answer": x}
    t = traj_of([([("submit", {"answer": fmt.format(x)})], [], False)], row)
    assert score("answer_match", t, rel_tol=1e-5, abs_tol=1e-5).score == 1.0
    far = traj_of([([("submit", {"answer": x + 1 + abs(x) * 1e-3})], [], False)], row)
    assert score("answer_match", far, rel_tol=1e-6, abs_tol=1e-6).score == 0.0


def test_success_reads_env_info():
    assert score("success", Trajectory(info={"success": True})).score == 1.0
    assert score("success", Trajectory(info={"success": 0})).score == 0.0
    with pytest.raises(ValueError, match="success"):
        score("success", Trajectory())


# --- penalties -------------------------------------------------------------------------------
@given(st.integers(0, 2000), st.integers(1, 1000), st.data())
@SETTINGS
def test_property_length_penalty(length, max_tokens, data):
    buffer = data.draw(st.integers(0, max_tokens))
    fn = make_reward("length_penalty", max_tokens=max_tokens, buffer=buffer)
    import asyncio

    s = asyncio.run(fn.one(Trajectory(sampled_tokens=length)))
    s_next = asyncio.run(fn.one(Trajectory(sampled_tokens=length + 1)))
    assert -1.0 <= s_next <= s <= 0.0
    assert (s == 0.0) == (length <= max_tokens - buffer)
    assert (s == -1.0) == (length > max_tokens or (buffer > 0 and length == max_tokens))


def test_length_penalty_config_and_sampled_tokens():
    with pytest.raises(ValueError, match="max_tokens"):
        make_reward("length_penalty", max_tokens=0)
    with pytest.raises(RewardConfigError, match="max_tokens"):
        make_reward("length_penalty")  # required kwarg
    # the length is the tokens the policy sampled, not the observation tokens in the response
    long = Trajectory.from_dict({"sampled_tokens": 9, "response_tokens": 30})
    assert score("length_penalty", long, max_tokens=8, buffer=0).score == -1.0
    assert score("length_penalty", long, max_tokens=9, buffer=0).score == 0.0


@given(st.integers(0, 20), st.floats(0, 1), st.integers(0, 5), st.floats(0, 3))
@SETTINGS
def test_property_turn_penalty(n, penalty, free, cap):
    t = traj_of([([], [], False)] * n)
    s = score("turn_penalty", t, penalty=penalty, free_turns=free, max_penalty=cap).score
    assert -cap - 1e-12 <= s <= 0.0
    assert s == pytest.approx(-min(cap, penalty * max(0, n - free)))


@given(st.lists(st.lists(st.sampled_from(["wrong_type", "timeout", "unknown_tool"]),
                         max_size=4), min_size=1, max_size=5))
@SETTINGS
def test_property_tool_error_penalty(errors_per_turn):
    turns = [TurnRecord(parse=ParseResult([], ""), errors=[
        {"type": e, "tool": "t", "message": "m"} for e in errs]) for errs in errors_per_turn]
    t = Trajectory(turns=turns)
    res = score("tool_error_penalty", t, penalty=0.1, max_penalty=10.0)
    total = sum(len(e) for e in errors_per_turn)
    assert res.score == pytest.approx(-0.1 * total)
    assert res.per_turn == pytest.approx([-0.1 * len(e) for e in errors_per_turn])
    only = score("tool_error_penalty", t, penalty=1.0, max_penalty=2.0, types=["timeout"])
    n_timeouts = sum(e.count("timeout") for e in errors_per_turn)
    assert only.score == -min(2.0, n_timeouts)
    assert math.isclose(res.components["count"], total)


def test_format_and_bfcl_ast_through_the_real_parser():
    tools = [tool("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"])]
    actions = ['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
               '<tool_call>{"name": "add", "arguments": {"a": 1,, }}</tool_call>',
               '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}',
               '<tool_call>{"name": "mul", "arguments": {"a": 1}}</tool_call>',
               "The answer is 3."]
    row = {"category": "simple", "ground_truth": [{"add": {"a": [1], "b": [2]}}]}
    t = Trajectory(turns=parsed(actions, "hermes"), tools=tools, format="hermes", row=row)
    res = score("format", t)
    assert res.per_turn == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert "invalid_json" in res.reason and "unclosed_tag" in res.reason
    # the parse errors of turns 2-3 fail the exact match, even though turn 1 was right
    assert score("bfcl_ast", t).score == 0.0
    one = Trajectory(turns=parsed(actions[:1], "hermes"), tools=tools, row=row)
    assert score("bfcl_ast", one).score == 1.0
    mistral = Trajectory(
        turns=parsed(['[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]'], "mistral"),
        tools=tools, format="mistral", row=row)
    assert score("bfcl_ast", mistral).score == 1.0 and score("format", mistral).score == 1.0
    # rewards read the env's parse and never parse the text again: a turn recorded without
    # one holds no call, whatever its text says
    unparsed = Trajectory(turns=[TurnRecord(action=actions[0])], tools=tools, row=row,
                          format="hermes")
    assert score("bfcl_ast", unparsed).score == 0.0


def parsed(actions, fmt):
    """Turns as an env of format ``fmt`` records them (its one parse of each action)."""
    parser = get_format(fmt)
    return [TurnRecord(action=a, parse=parser.parse(a)) for a in actions]
