"""The compute account's counting (toolrl.trainer.compute); the trainer's metrics are checked
end to end in test_trainer_e2e.py::test_ppo_config_runs_three_steps."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from toolrl import batch as B
from toolrl.trainer.compute import ModelShape, batch_tokens, model_shape, step_account


def _batch(prompts: list[list[int]], answers: list[int], width: int = 4) -> TensorDict:
    """Rows with these prompts (left-padded to ``width``) and this many response tokens."""
    n, length = len(prompts), max(answers)
    ids = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width + length, dtype=torch.long)
    for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        ids[i, width - len(prompt):] = torch.tensor(prompt)
        mask[i, width - len(prompt):width + answer] = 1
    return TensorDict({B.PROMPTS: ids, B.ATTENTION_MASK: mask}, batch_size=[n])


def test_a_shared_prompt_counts_once_and_padding_never():
    tokens, context = batch_tokens(_batch([[5, 6], [5, 6], [7]], [3, 1, 2]))
    assert tokens == 2 + 1 + 3 + 1 + 2  # the prompt [5, 6] once, every response token
    # positions attended: prompt [5, 6] 1 + 2; its responses 3 + 4 + 5 and 3; prompt [7] 1,
    # its responses 2 + 3
    assert context == pytest.approx((1 + 2 + 3 + 4 + 5 + 3 + 1 + 2 + 3) / 9)
    # a prompt whose first real id is 0 is not the shorter prompt padded to its width
    assert batch_tokens(_batch([[0, 6], [6]], [1, 1]))[0] == 2 + 1 + 1 + 1


def test_step_account_counts_epochs_and_passes():
    shape = ModelShape(params=1000, layers=2, hidden=8)
    batch = _batch([[1, 2], [3]], [2, 1])  # 6 tokens
    out = step_account(shape, batch, {"update": 2.0, "log_probs": 0.5}, epochs=3,
                       log_prob_passes=2)
    forward = shape.flop_per_token(batch_tokens(batch)[1], training=False)
    assert out["perf/flop_per_token"] == forward
    assert out["perf/update_tokens"] == 18 and out["perf/log_prob_tokens"] == 12
    assert out["perf/update_flop_per_s"] == pytest.approx(3 * forward * 18 / 2.0)
    assert out["perf/log_prob_flop_per_s"] == pytest.approx(forward * 12 / 0.5)
    assert "perf/log_prob_tokens" not in step_account(shape, batch, {"update": 1.0}, epochs=1,
                                                      log_prob_passes=0)
    assert step_account(None, batch, {"update": 1.0}, epochs=1, log_prob_passes=0) == {}


def test_model_shape_reads_the_checkpoint_without_loading_it(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    shape = model_shape(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert shape.params == sum(p.numel() for p in model.parameters())  # tied head once
    assert (shape.layers, shape.hidden) == (model.config.num_hidden_layers,
                                            model.config.hidden_size)
    assert model_shape(tmp_path) is None  # nothing there: no perf/* metrics, no error
