"""The merge of an agent episode's calls into training samples (pure logic, a fake renderer)."""

from __future__ import annotations

import pytest

from toolrl.core.types import ParseResult, ToolCall
from toolrl.rollout.gateway.capture import CallRecord, EpisodeCapture, template_messages

EOS = 0


class FakeRenderer:
    """Prompt: one id per message (100 + count); delta: 50 per new message, then 51."""

    eos_token_id = EOS

    def render_prompt(self, messages, tools=None):
        return [100 + len(messages)] * len(messages)

    def render_delta(self, new, tools=None, after_eos=True):
        return [50] * len(new) + ([51] if after_eos else [52, 51])


def call(capture, messages, completion, tools=(), calls=(), versions=(), constrained=False):
    """Record one call as the gateway does: prompt_for, then the reply."""
    messages = template_messages(messages)
    prompt, extends = capture.prompt_for(messages, list(tools), FakeRenderer())
    reply = {"role": "assistant", "content": "x" * len(completion)}
    if calls:
        reply = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": n, "arguments": '{"a": 1}'}} for i, n in enumerate(calls)]}
    [reply_t] = template_messages([reply])
    capture.calls.append(CallRecord(
        messages=messages, tools=list(tools), prompt_ids=prompt,
        completion_ids=list(completion), log_probs=[-0.5] * len(completion), reply=reply_t,
        text="t", parse=ParseResult(calls=[ToolCall(n, {"a": 1}) for n in calls], text=""),
        finish_reason="stop", extends=extends, versions=list(versions),
        constrained=constrained))
    return reply


USER = [{"role": "user", "content": "hi"}]


def test_calls_that_extend_merge_into_one_sample():
    cap = EpisodeCapture("e")
    r1 = call(cap, USER, [7, 8, EOS], calls=["add"], versions=[3, 3, 4])  # a push landed
    # the SDK echoes the reply with its own extra keys and the call ids
    echo = {**r1, "refusal": None, "annotations": []}
    tool = {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "2"}
    call(cap, [*USER, echo, tool], [9, EOS], versions=[4, 4])
    [s] = cap.samples()
    assert cap.splits == 0 and [c.extends for c in cap.calls] == [False, True]
    assert s.tokens.prompt_ids == [101]
    assert s.tokens.response_ids == [7, 8, EOS, 50, 51, 9, EOS]
    assert s.tokens.response_mask == [1, 1, 1, 0, 0, 1, 1]
    assert s.tokens.log_probs == [-0.5, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
    assert s.tokens.versions == [3, 3, 4, -1, -1, 4, 4]  # each sampled token's weights
    assert s.spans == [(0, 3), (5, 7)] and s.deltas == [(3, 5)]
    traj, samples = cap.trajectory({"id": 1, "ground_truth": 2}, format="hermes",
                                   info={"success": True})
    assert traj.success and traj.tokens == samples[0].tokens
    assert [t.action_span for t in traj.turns] == [(0, 3), (5, 7)]
    assert traj.turns[0].observation_span == (3, 5) and traj.turns[1].observation_span is None
    assert [(r.name, r.content) for r in traj.turns[0].results] == [("add", "2")]
    assert [c.name for c in traj.calls] == ["add"]
    assert traj.messages[-1]["role"] == "assistant" and traj.sampled_tokens == 5


def test_a_completion_cut_without_eos_gets_the_full_closing():
    cap = EpisodeCapture("e")
    r1 = call(cap, USER, [7, 8])
    call(cap, [*USER, r1, {"role": "user", "content": "more"}], [9])
    assert cap.samples()[0].tokens.response_ids == [7, 8, 50, 52, 51, 9]


@pytest.mark.parametrize("change", ["rewrite", "drop_reply", "tools", "edit_reply"])
def test_a_history_that_does_not_extend_starts_a_new_sample(change):
    cap = EpisodeCapture("e")
    tools = [{"type": "function", "function": {"name": "add"}}]
    r1 = call(cap, USER, [7, EOS], tools=tools)
    more = {"role": "user", "content": "more"}
    history, new_tools = [*USER, r1, more], tools
    if change == "rewrite":
        history = [{"role": "user", "content": "summary"}]
    elif change == "drop_reply":
        history = [*USER, more]
    elif change == "tools":
        new_tools = [*tools, {"type": "function", "function": {"name": "mul"}}]
    else:
        history = [*USER, {**r1, "content": "something else"}, more]
    call(cap, history, [9, EOS], tools=new_tools, constrained=True)
    samples = cap.samples()
    assert cap.splits == 1 and len(samples) == 2
    assert samples[1].tokens.prompt_ids == FakeRenderer().render_prompt(history)
    assert samples[1].tokens.response_mask == [1, 1]
    traj, _ = cap.trajectory({}, format="hermes")
    assert traj.extra["gateway"] == {"calls": 2, "samples": 2, "splits": 1,
                                     "turn_sample": [0, 1], "constrained": 1,
                                     "apis": ["chat.completions"] * 2}
    assert traj.turns[0].results == []  # the next call did not extend: nothing observed


def test_openai_messages_become_template_messages():
    [sys, user, asst] = template_messages([
        {"role": "developer", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]},
        {"role": "user", "content": "q", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
    ])
    assert sys == {"role": "system", "content": "ab"}
    assert user == {"role": "user", "content": "q", "name": "ann"}
    assert asst["content"] == "" and asst["tool_calls"][0]["function"]["arguments"] == {"x": 1}


def test_tool_results_without_a_name_are_named_by_the_call_they_answer():
    """The OpenAI SDKs send ``{"role": "tool", "tool_call_id": ...}`` without ``name``: the
    result is named by the function of the call with that id, not by the id."""
    cap = EpisodeCapture("e")
    r1 = call(cap, USER, [7, EOS], calls=["add", "mul"])
    results = [{"role": "tool", "tool_call_id": "call_1", "content": "6"},
               {"role": "tool", "tool_call_id": "call_0", "content": "5"},
               {"role": "tool", "tool_call_id": "call_9", "content": "?"}]
    call(cap, [*USER, r1, *results], [9, EOS])
    traj, _ = cap.trajectory({"id": 1}, format="hermes")
    assert [(r.name, r.content) for r in traj.turns[0].results] == \
        [("mul", "6"), ("add", "5"), ("call_9", "?")]  # an id no call made stays an id


def test_a_reply_that_fails_to_parse_counts_as_a_tool_error_as_on_the_env_path():
    """One definition of a tool error: the env path's typed ``parse_error`` records."""
    import asyncio

    from tensordict import TensorDict

    import toolrl
    from toolrl import batch as B
    from toolrl.core.parse import get_format
    from toolrl.rollout.worker import rollout_metrics

    bad = '<tool_call>{"name": "submit}}</tool_call>'
    parse = get_format("hermes").parse(bad)
    assert parse.errors  # invalid_json
    cap = EpisodeCapture("e")
    call(cap, USER, [7, EOS])
    cap.calls[0].parse, cap.calls[0].text = parse, bad
    gateway, _ = cap.trajectory({"id": 1}, format="hermes")

    env = toolrl.make_env("toolrl/Calculator-v0")
    try:
        env_path = asyncio.run(toolrl.run_episode(env, lambda e, m: bad, seed=0))
    finally:
        env.close()
    assert [e["type"] for e in gateway.errors] == ["parse_error"] * len(parse.errors)
    assert [e["type"] for e in env_path.turns[0].errors] == [e["type"] for e in gateway.errors]
    for traj in (gateway, env_path):  # the env path's policy repeats the turn to max_turns
        td = TensorDict({}, batch_size=[1])
        B.set_non_tensor(td, B.TRAJECTORIES, [traj])
        assert rollout_metrics(td)["rollout/tool_errors_mean"] == \
            len(parse.errors) * traj.num_turns
