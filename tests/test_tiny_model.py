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



def test_the_trained_tokenizer_is_handed_out_as_independent_copies():
    """A process trains the tiny tokenizer once per (seed, vocabulary): each caller gets its
    own copy (changing one changes no other), equal to a fresh training."""
    from toolrl.models import tiny

    first = tiny.build_tokenizer(seed=5)
    first.add_tokens(["<only-in-this-copy>"])
    first.chat_template = "changed"
    second = tiny.build_tokenizer(seed=5)
    assert "<only-in-this-copy>" not in second.get_vocab()
    assert second.chat_template == tiny.CHAT_TEMPLATE
    tiny._trained_tokenizer.cache_clear()
    fresh = tiny.build_tokenizer(seed=5)
    text = "add(a: 12, b: 30) <tool_call>{\"name\": \"add\"}</tool_call>"
    assert fresh.get_vocab() == second.get_vocab() and fresh(text) == second(text)
    assert tiny.build_tokenizer(seed=6).get_vocab() != second.get_vocab()


def test_a_build_of_an_older_format_is_rebuilt_and_a_users_folder_is_not(tmp_path):
    """A run that builds its model (``model.build_tiny_if_missing``) rebuilds a tiny folder
    an older toolrl wrote (its template may be another), keeps a current one of any seed,
    refuses one of another size, and never touches a folder without the stamp."""
    import json

    from toolrl.models.tiny import STAMP, is_current, needs_build

    a = build_tiny_model(tmp_path / "a", seed=3)
    assert is_current(a) and not needs_build(a) and not needs_build(a, "small")
    assert needs_build(tmp_path / "missing")
    with pytest.raises(ValueError, match="holds a tiny 'small' model, and model"):
        needs_build(a, "medium")  # another size: never built over (another run's model)
    stamp = json.loads((a / STAMP).read_text())
    (a / STAMP).write_text(json.dumps({**stamp, "format": stamp["format"] - 1}))
    assert not is_current(a) and needs_build(a)
    assert _digest(build_tiny_model(a, seed=3)) == _digest(build_tiny_model(tmp_path / "b",
                                                                            seed=3))
    assert is_current(a)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    assert not needs_build(tmp_path / "mine")  # a user's checkpoint: loaded as it is

SMALL_REAL_VOCAB = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 64,
                    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "tie_word_embeddings": True}


def test_real_shapes_have_the_released_parameter_counts():
    from toolrl.models.tiny import REAL_SHAPES, shape_config

    released = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304,
                "qwen3-0.6b": 596_049_920, "qwen3-8b": 8_190_735_360}
    assert set(released) <= set(REAL_SHAPES)
    for size, count in released.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(shape_config(size))
        assert sum(p.numel() for p in model.parameters()) == count, size


def test_a_real_vocabulary_with_the_tiny_tokenizer(tmp_path):
    path = build_tiny_model(tmp_path / "m", config=SMALL_REAL_VOCAB)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.get_input_embeddings().weight.shape == (151936, 64)
    assert len(tok) == 4096 < model.config.vocab_size
    assert model.config.eos_token_id == tok.eos_token_id
    assert next(AutoModelForCausalLM.from_pretrained(path, dtype="auto").parameters()).dtype \
        == torch.bfloat16  # saved as released checkpoints are
    ids = tok("What is 1 plus 2?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert model(ids).logits.shape[-1] == 151936
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(path, config=SMALL_REAL_VOCAB) == path  # cached
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    wider = build_tiny_model(path, config={**SMALL_REAL_VOCAB, "hidden_size": 96})
    assert AutoModelForCausalLM.from_pretrained(wider).config.hidden_size == 96
    with pytest.raises(ValueError, match="model_type"):
        build_tiny_model(tmp_path / "n", config={"vocab_size": 151936})
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        build_tiny_model(tmp_path / "n", config={**SMALL_REAL_VOCAB, "vocab_size": 1000})
    assert not list(tmp_path.glob(".tiny-*"))
