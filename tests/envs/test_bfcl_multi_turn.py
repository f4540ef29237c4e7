"""toolrl/BFCLMultiTurn-v0: BFCL's multi-turn entries on BFCL's own backends, scored by BFCL's own
checker (the 800-entry agreement runs in benchmarks/bench_bfcl_multi_turn.py; a sample of it is
tests/benchmarks/test_bench_bfcl_multi_turn.py)."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest

from toolrl import make_env, run_episode
from toolrl.core import bfcl_multi_turn as mt
from toolrl.core.types import ToolCall
from toolrl.data import load_bfcl_multi_turn

ENV = "toolrl/BFCLMultiTurn-v0"


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    """The first entry of each scored category and of the composite set, by category."""
    return {c: load_bfcl_multi_turn(c, limit=1)[0]
            for c in (*mt.MULTI_TURN_CATEGORIES, "multi_turn_composite")}


def play(row, policy=None):
    env = make_env(ENV)
    try:
        kwargs = {} if policy is None else {"policy": policy}
        return asyncio.run(run_episode(env, row=copy.deepcopy(row), **kwargs)), env.unwrapped
    finally:
        env.close()


@pytest.mark.parametrize("category", [*mt.MULTI_TURN_CATEGORIES, "multi_turn_composite"])
def test_the_oracle_plays_the_possible_answer_and_bfcl_passes_it(rows, category):
    traj, _ = play(rows[category])
    assert traj.success and traj.finish_reason == "terminated", traj.final_state["bfcl"]
    result = traj.final_state["bfcl"]
    assert result["valid"] and result["turns_reached"] == len(rows[category]["question"])
    assert all(t["state"] is not False and t["response"] is not False
               for t in result["per_turn"])
    # the user turns came in order, one user message block per turn
    users = [m["content"] for m in traj.messages if m["role"] == "user"]
    assert len(users) == len(rows[category]["question"])


def test_miss_func_holds_the_function_back_until_its_turn(rows):
    row = rows["multi_turn_miss_func"]
    (turn, names), = row["missed_function"].items()
    env = make_env(ENV)
    _, info = env.reset(options=copy.deepcopy(row))
    offered = {t["function"]["name"] for t in info["tools"]}
    assert not set(names) & offered and "cd" in offered
    traj, _ = play(row)
    users = [m["content"] for m in traj.messages if m["role"] == "user"]
    added = users[int(turn)]
    assert "I have updated some more functions you can choose from" in added
    assert json.loads(added.split("\n")[0])[0]["name"] == names[0]
    env.close()


def test_a_wrong_call_fails_with_bfcls_reason_and_the_turn_shows_it(rows):
    row = rows["multi_turn_base"]
    truth = [[mt.parse_call_string(s, row["involved_classes"]) for s in t]
             for t in row["ground_truth"]]
    truth[0][-1] = ToolCall(truth[0][-1].name, {**truth[0][-1].arguments,
                                                "destination": "archive"})
    played = {"turn": 0, "done": False}

    def policy(env, messages):
        base = env.unwrapped
        if base.user_turn != played["turn"]:
            played.update(turn=base.user_turn, done=False)
        if not played["done"]:
            played["done"] = True
            return base.render_calls(truth[base.user_turn])
        return "Done."

    traj, _ = play(row, policy)
    result = traj.final_state["bfcl"]
    assert not traj.success and traj.turns[-1].env_reward == 0.0
    assert result["error_type"] == "multi_turn:instance_state_mismatch"
    assert result["per_turn"][0]["state"] is False


def test_calls_run_on_the_backends_and_return_their_real_outputs(rows):
    env = make_env(ENV)
    env.reset(options=copy.deepcopy(rows["multi_turn_base"]))
    obs, *_ = env.step('<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
                       '<tool_call>{"name": "cd", "arguments": {"folder": "document"}}'
                       '</tool_call><tool_call>{"name": "ls", "arguments": {}}</tool_call>')
    assert json.loads(obs[0]["content"]) == {"current_directory_content": ["document",
                                                                          "archive"]}
    assert json.loads(obs[2]["content"])["current_directory_content"] == [
        "final_report.pdf", "previous_report.pdf"]  # in order: after the cd
    obs, *_ = env.step('<tool_call>{"name": "cd", "arguments": {"nope": 1}}</tool_call>')
    assert obs[0]["content"].startswith("Error during execution: ")
    env.close()


def test_episodes_of_one_entry_share_nothing_and_leave_no_cache(rows):
    import bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils as utils

    row = rows["multi_turn_base"]
    a, b = make_env(ENV), make_env(ENV)
    a.reset(options=copy.deepcopy(row))
    b.reset(options=copy.deepcopy(row))
    a.step('<tool_call>{"name": "cd", "arguments": {"folder": "document"}}</tool_call>'
           '<tool_call>{"name": "mkdir", "arguments": {"dir_name": "temp"}}</tool_call>')
    obs, *_ = b.step('<tool_call>{"name": "ls", "arguments": {}}</tool_call>')
    assert json.loads(obs[0]["content"])["current_directory_content"] == ["document", "archive"]
    traj, _ = play(row)
    assert traj.success
    assert not [k for k in vars(utils) if k.startswith("toolrl_")]
    a.close()
    b.close()


def test_more_than_bfcls_step_limit_force_terminates(rows):
    traj, _ = play(rows["multi_turn_base"],
                     lambda env, messages: env.unwrapped.render_calls([ToolCall("pwd", {})]))
    result = traj.final_state["bfcl"]
    assert len(traj.turns) == mt.max_steps() + 1 and result["force_terminated"]
    assert result["error_type"] == "multi_turn:force_terminated" and not traj.success


def test_a_turn_ends_on_a_message_without_a_call_and_empty_turns_expect_one(rows):
    row = rows["multi_turn_miss_param"]
    traj, _ = play(row, lambda env, messages: "Could you tell me more?")
    result = traj.final_state["bfcl"]
    assert len(traj.turns) == len(row["question"])
    assert result["error_type"] == "multi_turn:empty_turn_model_response"
    asked = [t["held_back"] for t in result["per_turn"] if t["held_back"] is not None]
    assert asked == [True]


@pytest.mark.parametrize("change,match", [
    (lambda r: r.update(involved_classes=["Nope"]), "unknown involved classes"),
    (lambda r: r.update(ground_truth=r["ground_truth"][:-1]), "turns of ground truth"),
    (lambda r: r["ground_truth"][0].append("__import__('os')"), "not a method"),
    (lambda r: r["ground_truth"][0].append("cd(folder=x)"), "not all literals"),
    (lambda r: r["ground_truth"][0].append("cd(dir='x')"), "does not fit"),
    (lambda r: r.pop("question"), "lacks 'question'"),
    (lambda r: r.update(missed_function={"9": ["cd"]}), "missed_function"),
    (lambda r: r.update(initial_config={"GorillaFileSystem": {"root": 5}}), "cannot load"),
])
def test_bad_rows_are_clear_errors(rows, change, match):
    row = copy.deepcopy(rows["multi_turn_base"])
    change(row)
    env = make_env(ENV)
    with pytest.raises(ValueError, match=match):
        env.reset(options=row)
    env.close()


def test_calls_reach_bfcls_eval_only_as_safe_strings(tmp_path):
    classes = ["GorillaFileSystem"]
    assert mt.render_call(ToolCall("mv", {"source": "a'b", "destination": "c"}), classes) == \
        "mv(source=\"a'b\",destination='c')"
    bad_key = ToolCall("mv", {"source=open('x','w'),y": 1})
    assert mt.render_call(bad_key, classes) == "toolrl_unrenderable_call("
    assert mt.render_call(ToolCall("cd", {"folder": {1, 2}}), classes) == \
        "toolrl_unrenderable_call("
    target = tmp_path / "written"
    opened = ToolCall("open", {"file": str(target), "mode": "w"})
    assert mt.render_call(opened, classes).startswith("toolrl_undefined_open(")
    entry = mt.Entry.from_row({"id": "multi_turn_base_x", "question": [[{"role": "user",
                               "content": "hi"}]], "initial_config": {},
                               "involved_classes": classes, "ground_truth": [["pwd()"]]})
    verdict = mt.checker_verdict(entry, [[[opened, bad_key]]])
    assert not verdict.valid and not target.exists()


def test_the_row_check_and_the_converter_drop_unplayable_composite_rows(tmp_path):
    from toolrl.data import check_rows
    from toolrl.data.convert import convert

    rows = load_bfcl_multi_turn("multi_turn_composite", limit=12)
    report = check_rows(rows, "composite")
    bad = {p.row_id: p.kind for p in report.blocking}
    assert bad == {"multi_turn_composite_4": "unplayable gold answer",
                   "multi_turn_composite_8": "unplayable gold answer",
                   "multi_turn_composite_11": "unplayable gold answer"}
    source = tmp_path / "own.jsonl"
    source.write_text("".join(json.dumps({k: v for k, v in r.items()
                                          if k not in ("env", "source")}) + "\n"
                              for r in rows[:3]))
    report = convert("bfcl-multi-turn", [source], tmp_path / "out.jsonl")
    assert report.written == 3 and not report.errors
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert {r["env"] for r in out} == {ENV} and {r["source"] for r in out} == {"own"}


def test_eval_metrics_sum_bfcls_verdicts_and_the_turns_per_category(rows):
    from toolrl.envs.bfcl_multi_turn import BFCLMultiTurnEnv

    good, _ = play(rows["multi_turn_miss_param"])
    bad, _ = play(rows["multi_turn_miss_param"], lambda env, messages: "I cannot.")
    base, _ = play(rows["multi_turn_base"])
    figures = BFCLMultiTurnEnv.eval_metrics([good, bad, base])
    miss = figures["multi_turn_miss_param"]
    assert miss["n"] == 2 and miss["accuracy"] == 0.5
    assert miss["turn_state_match"] == 0.5 and miss["asked_when_answer_empty"] == 1.0
    assert figures["multi_turn_base"]["accuracy"] == 1.0
