"""Helpers of the tests that compare the engine's tokens and log-probs with transformers."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer


def chat_prompt_ids(model_dir) -> list[int]:
    """The token ids of one short user turn, rendered by the model's chat template."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    return list(tok.apply_chat_template([{"role": "user", "content": "What is 12 plus 30?"}],
                                        add_generation_prompt=True, tokenize=True,
                                        return_dict=False))


def hf_log_probs(model, prompt: list[int], sampled: list[int]) -> torch.Tensor:
    """Transformers' log-probs (fp32) of ``sampled`` after ``prompt``."""
    ids = torch.tensor([prompt + sampled])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1: -1].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(sampled)), torch.tensor(sampled)]
