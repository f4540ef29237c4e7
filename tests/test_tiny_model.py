"""The locally built tiny model: a real HF checkpoint with a tools-aware chat template."""

from __future__ import annotations

import hashlib

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from toolrl.models.tiny import build_tiny_model

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                     "b": {"type": "number"}},
                   "required": ["a", "b"]}}}]

CONVERSATION = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "What is 12 plus 30, and 1 plus 2?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 12, "b": 30}}},
        {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
    {"role": "tool", "name": "add", "content": "42"},
    {"role": "tool", "name": "add", "content": "3"},
    {"role": "assistant", "content": "The answers are 42 and 3."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You are welcome."},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def render(tokenizer, messages, **kw):
    return tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, **kw)


def test_loads_in_transformers_and_runs_forward(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.tie_word_embeddings
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < n_params < 5e6
    ids = tokenizer("What is 1 plus 2?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
    assert model.config.vocab_size >= len(tokenizer)


def test_tokenizer_shape(tokenizer, tiny_model_dir):
    assert 2000 <= len(tokenizer) <= 8192
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    # every digit is its own token
    assert tokenizer.tokenize("12345") == ["1", "2", "3", "4", "5"]
    # tool markup is a single token that survives decoding without special tokens
    for mark in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"):
        ids = tokenizer.encode(mark, add_special_tokens=False)
        assert len(ids) == 1
        assert tokenizer.decode(ids, skip_special_tokens=True) == mark
    # AutoTokenizer uses exactly the trained tokenizer.json
    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    text = render(tokenizer, CONVERSATION)
    assert raw.encode(text).ids == tokenizer.encode(text, add_special_tokens=False)


def test_chat_template_renders_tools_and_calls(tokenizer):
    text = render(tokenizer, CONVERSATION[:5], add_generation_prompt=True)
    assert "<tools>\nadd(a: number, b: number) - Add two numbers.\n</tools>" in text
    assert text.startswith("<|im_start|>system\nUse the tools.")
    assert ('<tool_call>{"name": "add", "arguments": {"a": 12, "b": 30}}</tool_call>'
            '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><|im_end|>'
            ) in text
    assert "<|im_start|>tool\n<tool_response>42</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template_is_prefix_preserving(tokenizer):
    for k in range(1, len(CONVERSATION)):
        shorter = render(tokenizer, CONVERSATION[:k])
        longer = render(tokenizer, CONVERSATION[: k + 1])
        assert longer.startswith(shorter), k
        with_prompt = render(tokenizer, CONVERSATION[:k], add_generation_prompt=True)
        if CONVERSATION[k]["role"] == "assistant":
            assert longer.startswith(with_prompt), k
        # token level: the shorter rendering tokenizes to a prefix of the longer one
        a = tokenizer.encode(shorter, add_special_tokens=False)
        b = tokenizer.encode(longer, add_special_tokens=False)
        assert b[: len(a)] == a, k


def _digest(path):
    h = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def test_deterministic_cached_and_guarded(tmp_path):
    a = build_tiny_model(tmp_path / "a", seed=3)
    b = build_tiny_model(tmp_path / "b", seed=3)
    assert _digest(a) == _digest(b)
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(a, seed=3) == a  # cached: a no-op
    assert (a / "model.safetensors").stat().st_mtime_ns == mtime
    c = build_tiny_model(tmp_path / "c", seed=4)
    assert _digest(c) != _digest(a)
    assert _digest(build_tiny_model(a, seed=4)) == _digest(c)  # another seed replaces it
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a tiny-model directory"):
        build_tiny_model(tmp_path / "e")
    with pytest.raises(ValueError, match="unknown size"):
        build_tiny_model(tmp_path / "d", size="huge")
    assert not list(tmp_path.glob(".tiny-*"))  # no temp dirs left behind
