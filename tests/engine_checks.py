"""Helpers of the tests that compare the engine's tokens and log-probs with transformers."""

from __future__ import annotations

import psutil
import torch
from transformers import AutoTokenizer

from toolrl.rollout import engine_guard


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


def child_pids() -> set[int]:
    """This process's descendants now."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def left_running(before: set[int]) -> list[psutil.Process]:
    """Descendants started since ``before`` that still run after an engine's shutdown, less
    the two a process keeps on purpose: multiprocessing's resource tracker and the fork server
    the next CPU engine forks its core from (`toolrl.rollout.engine_guard`)."""
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in before
            and "resource_tracker" not in _command(p) and p.pid != engine_guard.fork_server_pid()
            and _command(p) != ENDED]


ENDED = "(ended)"


def _command(proc: psutil.Process) -> str:
    """``proc``'s command line; ``ENDED`` for one that has exited (a zombie not yet reaped, or
    gone since it was listed): not running."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ENDED
