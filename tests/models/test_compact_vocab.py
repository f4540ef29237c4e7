"""A compact vocabulary: DeepSeek-R1-Distill's real tokenizer restricted to a task's tokens,
the same pieces on those texts, and a renderer that refuses any text it would split otherwise."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from toolrl.models.compact import VOCAB_FILE, compact_tokenizer
from toolrl.rollout.chat import ChatRenderer, TemplateError
from toolrl.trainer.warm_start import copy_vocab

TEXTS = ["What is 12 plus 345?", "<｜User｜>Use the tools.<｜Assistant｜><think>\nadd 1 2\n"
         "</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json"
         '\n{"a": 1, "b": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>']


@pytest.fixture(scope="module")
def compact(family_tokenizers, tmp_path_factory):
    out = tmp_path_factory.mktemp("compact")
    real = family_tokenizers["deepseek-r1-distill"]
    compact_tokenizer(real, TEXTS, out, family="deepseek-r1-distill")
    return AutoTokenizer.from_pretrained(out), real, out


def test_same_pieces_fewer_ids(compact):
    tok, real, out = compact
    record = json.loads((out / VOCAB_FILE).read_text())
    ids = record["real_ids"]
    assert len(tok) == record["vocab"] == len(ids) < 1000 and record["real_vocab"] == 152064
    for text in [*TEXTS, "What is 907 plus 13?"]:  # digits and known words recombine
        assert [ids[i] for i in tok.encode(text, add_special_tokens=False)] == \
            real.encode(text, add_special_tokens=False)
    assert tok.eos_token == real.eos_token and tok.chat_template == real.chat_template


def test_the_renderer_refuses_a_text_the_compact_vocabulary_splits_otherwise(compact, tmp_path):
    tok, real, out = compact
    renderer = ChatRenderer(tok)
    assert renderer.family.name == "deepseek-r1-distill" and renderer.per_turn
    assert len(renderer.encode("What is 4 plus 5?")) > 0
    with pytest.raises(TemplateError, match="compact vocabulary cannot hold"):
        renderer.encode("Photosynthesis quarterly")  # bytes encode it, as other pieces
    # a checkpoint written from it keeps the map, so the check goes on after a warm start
    (tmp_path / "ckpt").mkdir()
    tok.save_pretrained(tmp_path / "ckpt")
    copy_vocab(out, tmp_path / "ckpt")
    again = ChatRenderer(AutoTokenizer.from_pretrained(tmp_path / "ckpt"), check=False)
    with pytest.raises(TemplateError, match="compact vocabulary"):
        again.encode("Photosynthesis quarterly")


def test_the_task_texts_hold_the_parse_errors_a_sampled_typo_gets():
    """The compact vocabulary's texts include the env's observations of typos in a call (a
    missing comma, extra data): without their words such an episode ends as an
    infrastructure failure and is never scored."""
    from toolrl.trainer.config import load_config
    from toolrl.trainer.warm_start import task_vocab_texts

    from toolrl.envs.calculator import CalculatorEnv

    cfg = load_config("configs/calculator_think.yaml")
    rows = CalculatorEnv.make_tasks(8, seed=0, **cfg.data.task_kwargs)
    texts = task_vocab_texts(cfg, rows[:4], rows[4:], n=4)
    joined = "\n".join(texts)
    for message in ("Expecting ',' delimiter", "Extra data", "Unterminated string"):
        assert message in joined, message
