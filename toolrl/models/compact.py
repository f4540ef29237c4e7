"""A real tokenizer restricted to the tokens a task uses: the same pieces, fewer ids.

A tiny model on a 152,064-token vocabulary spends almost all of its compute in the output head
(every sampled or trained position takes a 152,064-way softmax). `compact_tokenizer` keeps only
the tokens the real tokenizer produces on a task's texts (its prompts, tool listings, oracle
turns and tool results), the 256 byte tokens (so any text still encodes), the special tokens,
and every token a kept token is merged from (byte-level BPE reaches a token only through its
own merge, so the kept merges, in their order, split those texts exactly as the full list
does). Ids are renumbered ``0..K-1`` in the real order; ``toolrl_vocab.json`` beside it maps
each compact id to its real id, and ``real_tokenizer/`` holds the real tokenizer.

The pieces equal the real tokenizer's on the texts it was built from (checked when it is
built), but not on every text: `toolrl.rollout.chat.ChatRenderer` finds ``toolrl_vocab.json``
beside a tokenizer and checks every text it encodes against the real tokenizer; a text whose
pieces would differ ends its episode with one line naming it (`TemplateError`), so nothing
that differs from the real tokenizer's tokens is trained on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

__all__ = ["VOCAB_FILE", "compact_tokenizer"]

VOCAB_FILE = "toolrl_vocab.json"
REAL_DIR = "real_tokenizer"


def compact_tokenizer(real: Any, texts: Iterable[str], out: str | Path,
                      family: str | None = None) -> Any:
    """Save ``real`` restricted to what ``texts`` use (see the module docstring) to ``out``
    and return it. Raises ValueError when the restriction does not reproduce the real pieces
    on ``texts`` (a tokenizer this construction does not cover: not byte-level BPE)."""
    texts = list(texts)
    data = json.loads(real.backend_tokenizer.to_str())
    model = data["model"]
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise ValueError("compact vocabularies need a byte-level BPE tokenizer")
    vocab: dict[str, int] = model["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
              for m in model["merges"]]
    made_of = {a + b: (a, b) for a, b in reversed(merges)}  # the first rule wins
    keep: set[int] = set()
    for text in texts:
        keep.update(real.encode(text, add_special_tokens=False))
    keep.update(vocab[c] for c in bytes_to_unicode().values() if c in vocab)
    added = {t["id"]: t for t in data.get("added_tokens", [])}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        if getattr(real, name, None) is not None:
            keep.add(int(getattr(real, name)))
    by_id = {i: t for t, i in vocab.items()}
    stack = [by_id[i] for i in keep if i in by_id and i not in added]
    while stack:  # every token a kept token is merged from
        tok = stack.pop()
        for part in made_of.get(tok, ()):
            if vocab[part] not in keep:
                keep.add(vocab[part])
                stack.append(part)
    real_ids = sorted(keep)
    new = {old: i for i, old in enumerate(real_ids)}
    model["vocab"] = {t: new[i] for t, i in vocab.items() if i in new}
    model["merges"] = [list(m) for m in merges
                       if m[0] in model["vocab"] and m[1] in model["vocab"]
                       and m[0] + m[1] in model["vocab"]]
    data["added_tokens"] = [{**t, "id": new[t["id"]]} for t in data.get("added_tokens", [])
                            if t["id"] in new]
    backend = Tokenizer.from_str(json.dumps(data))
    special = {k: getattr(real, k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")
               if getattr(real, k, None) is not None}
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **special)
    tok.chat_template = real.chat_template
    for text in texts:
        got = [real_ids[i] for i in tok.encode(text, add_special_tokens=False)]
        if got != real.encode(text, add_special_tokens=False):
            raise ValueError(f"the compact vocabulary splits {text[:60]!r} differently")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    real.save_pretrained(out / REAL_DIR)
    (out / VOCAB_FILE).write_text(json.dumps({
        "family": family, "real_vocab": len(real), "vocab": len(real_ids),
        "real_ids": real_ids, "real_tokenizer": REAL_DIR}) + "\n")
    return tok
