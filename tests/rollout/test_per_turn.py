"""The per_turn history policy in the env loop, on DeepSeek-R1-Distill's real tokenizer and
think-stripping template: each model turn is its own sample, prompted exactly as the template
renders the history at inference; the warm start's transcripts are those samples."""

from __future__ import annotations

import asyncio
import json

import pytest

import toolrl
from toolrl.core.env import run_episode
from toolrl.rollout.chat import ChatRenderer
from toolrl.rollout.engine import Completion
from toolrl.rollout.episode import EpisodeConfig, EpisodeRunner
from toolrl.rollout.samples import episode_leads, is_episode_lead, one_per_episode, per_turn_rows
from toolrl.trainer.warm_start import per_turn_transcripts

ENV = "toolrl/Calculator-v0"
KWARGS = {"tool_format": "deepseek", "think": True}


class OracleEngine:
    """Stands in for vLLM: each turn is the env's oracle action, encoded, then the turn's end;
    it keeps every prompt it was given."""

    max_model_len = 2048

    def __init__(self, renderer, env) -> None:
        self.renderer, self.env, self.prompts = renderer, env, []

    async def generate(self, prompt_ids, sampling=None):
        self.prompts.append(list(prompt_ids))
        ids = [*self.renderer.encode(self.env.unwrapped.oracle_action()),
               self.renderer.eos_token_id]
        return [Completion(ids, [-0.5] * len(ids), "stop")]


@pytest.fixture(scope="module")
def renderer(family_tokenizers):
    return ChatRenderer(family_tokenizers["deepseek-r1-distill"])


@pytest.fixture(scope="module")
def row():
    env = toolrl.make_env(ENV, **KWARGS)
    try:
        return env.unwrapped.make_tasks(1, seed=3, difficulty=2, style="plain")[0]
    finally:
        env.close()


def test_each_turn_is_a_sample_prompted_as_at_inference(renderer, row):
    assert renderer.family.name == "deepseek-r1-distill" and renderer.per_turn
    env = toolrl.make_env(ENV, **KWARGS)
    engine = OracleEngine(renderer, env)
    try:
        traj = asyncio.run(EpisodeRunner(engine, renderer, EpisodeConfig(max_turns=6)).run(
            env, row=row, seed=0))
    finally:
        env.close()
    assert traj.success and traj.num_turns == 3  # two operations, then submit
    info = traj.extra["per_turn"]
    assert info["samples"] == 3 and info["turn_sample"] == [0, 1, 2]
    streams = [toolrl.core.trajectory.TokenStream.from_dict(s) for s in info["streams"]]
    streams.append(traj.tokens)
    tok = renderer.tokenizer
    for k, (stream, prompt) in enumerate(zip(streams, engine.prompts, strict=True)):
        assert stream.prompt_ids == prompt  # what the engine got is what trains
        assert all(stream.response_mask) and stream.response_ids[-1] == renderer.eos_token_id
        assert tok.decode(stream.response_ids).startswith("<think>\n")
        # the template's own rendering of the history as a client sends it back: the calls
        # as tool_calls with JSON-string arguments, no content, the reasoning gone
        want, turn = [], 0
        for m in traj.messages:
            if m["role"] == "assistant":
                if turn == k:
                    break
                call = traj.turns[turn].parse.calls[0]
                m = {"role": "assistant", "content": None, "tool_calls": [{
                    "type": "function", "function": {"name": call.name,
                                                     "arguments": json.dumps(call.arguments)}}]}
                turn += 1
            want.append(m)
        system = dict(want[0])
        system["content"] += "\n\n" + toolrl.rollout.chat.tool_listing(traj.tools, "deepseek")
        ref = tok.apply_chat_template([system, *want[1:]], add_generation_prompt=True,
                                      tokenize=True)
        ref = ref["input_ids"] if hasattr(ref, "keys") else ref
        assert prompt == list(ref), k
    later = tok.decode(streams[2].prompt_ids)
    assert "<think>" not in later  # the template dropped the earlier reasoning
    assert later.split("<｜User｜>")[1].count("<｜tool▁call▁begin｜>") == 2  # both calls
    # the rows of the batch: one per sample, the last one the episode's lead
    rows, uids, trajs = per_turn_rows([row], ["u0"], [traj])
    assert len(rows) == 3 and uids == ["u0"] * 3
    assert [t.tokens.prompt_ids for t in trajs] == engine.prompts
    assert [is_episode_lead(t) for t in trajs] == [False, False, True]
    assert episode_leads(trajs) == [2, 2, 2] and one_per_episode(trajs) == [trajs[2]]
    assert "streams" not in trajs[0].extra["per_turn"]
    # the warm start trains on exactly these samples
    env = toolrl.make_env(ENV, **KWARGS)
    try:
        oracle = asyncio.run(run_episode(env, row=row, seed=0, max_steps=6))
    finally:
        env.close()
    transcripts = per_turn_transcripts(oracle, renderer)
    assert [t.input_ids for t in transcripts] == \
        [s.prompt_ids + s.response_ids for s in streams]
    assert [sum(t.loss_mask) for t in transcripts] == [len(s.response_ids) for s in streams]


def test_a_prompt_over_the_budget_ends_the_episode_with_one_line(renderer, row):
    env = toolrl.make_env(ENV, **KWARGS)
    engine = OracleEngine(renderer, env)
    first = len(renderer.render_prompt(*_reset(env, row)))
    try:
        traj = asyncio.run(EpisodeRunner(engine, renderer, EpisodeConfig(
            max_turns=6, max_prompt_len=first + 10)).run(env, row=row, seed=0))
    finally:
        env.close()
    assert traj.finish_reason == "context" and traj.num_turns == 1
    assert "per_turn: the prompt of turn 2" in traj.error


def _reset(env, row):
    messages, info = env.reset(seed=0, options=row)
    return messages, info["tools"]
