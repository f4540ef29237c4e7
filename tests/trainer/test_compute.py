"""The compute account's counting (toolrl.trainer.compute); the trainer's metrics are checked
end to end in test_trainer_e2e.py::test_ppo_config_runs_three_steps."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from toolrl import batch as B
from toolrl.trainer.compute import ModelShape, batch_tokens, model_shape, step_account


def _batch(lengths: list[int], width: int = 6) -> TensorDict:
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n:] = 1  # left-padded, as prompts are
    return TensorDict({B.ATTENTION_MASK: mask}, batch_size=[len(lengths)])


def test_tokens_and_causal_context_count_real_tokens_only():
    tokens, context = batch_tokens(_batch([3, 1]))
    assert tokens == 4
    assert context == pytest.approx((1 + 2 + 3 + 1) / 4)  # positions each token attends to


def test_step_account_counts_epochs_and_passes():
    shape = ModelShape(params=1000, layers=2, hidden=8)
    out = step_account(shape, _batch([4, 2]), {"update": 2.0, "log_probs": 0.5},
                       epochs=3, log_prob_passes=2)
    forward = shape.flop_per_token(batch_tokens(_batch([4, 2]))[1], training=False)
    assert out["perf/flop_per_token"] == forward
    assert out["perf/update_tokens"] == 18 and out["perf/log_prob_tokens"] == 12
    assert out["perf/update_flop_per_s"] == pytest.approx(3 * forward * 18 / 2.0)
    assert out["perf/log_prob_flop_per_s"] == pytest.approx(forward * 12 / 0.5)
    assert "perf/log_prob_tokens" not in step_account(shape, _batch([4]), {"update": 1.0},
                                                      epochs=1, log_prob_passes=0)
    assert step_account(None, _batch([4]), {"update": 1.0}, epochs=1, log_prob_passes=0) == {}


def test_model_shape_reads_the_checkpoint_without_loading_it(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    shape = model_shape(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert shape.params == sum(p.numel() for p in model.parameters())  # tied head once
    assert (shape.layers, shape.hidden) == (model.config.num_hidden_layers,
                                            model.config.hidden_size)
    assert model_shape(tmp_path) is None  # nothing there: no perf/* metrics, no error
