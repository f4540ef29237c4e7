"""Actor checkpoints (torch.distributed.checkpoint) and Hugging Face export."""

from __future__ import annotations

import json

import pytest
import torch
from fsdp_harness import hf_log_probs, make_batch, run_ranks, with_policy_inputs
from safetensors import safe_open

from toolrl.batch import OLD_LOG_PROBS, split
from toolrl.workers.actor import ActorConfig, FSDPActor
from toolrl.workers.fsdp import full_state_dict


@pytest.fixture(scope="module")
def batches(tiny_model_dir):
    return [with_policy_inputs(tiny_model_dir, make_batch(8, seed=s), seed=s) for s in (5, 6)]


def _cfg(model_dir) -> ActorConfig:
    return ActorConfig(model_path=str(model_dir), lr=3e-4, micro_batch_size=2, warmup_steps=3,
                       lr_schedule="cosine", total_steps=10, ppo_mini_batch_size=4)


def _save_then_continue(rank, cfg, first, second, path):
    actor = FSDPActor(cfg)
    actor.update(first[rank])
    actor.save_checkpoint(path)
    return actor.update(second[rank])


def _load_then_continue(rank, cfg, second, path):
    actor = FSDPActor(cfg)
    actor.load_checkpoint(path)
    metrics = actor.update(second[rank])
    state = full_state_dict(actor.model)
    return metrics, state


def test_checkpoint_round_trip_restores_model_optimizer_schedule(tiny_model_dir, batches,
                                                                  tmp_path):
    cfg = _cfg(tiny_model_dir)
    first, second = (split(b, 2) for b in batches)
    path = str(tmp_path / "ckpt")
    uninterrupted = run_ranks(_save_then_continue, 2, cfg, first, second, path)[0]
    resumed = run_ranks(_load_then_continue, 2, cfg, second, path)
    # model, Adam moments, LR schedule and step counter all came back: identical next step
    assert resumed[0][0] == uninterrupted
    assert uninterrupted["actor/num_updates"] == 4.0
    # a fresh actor without the checkpoint takes a different step
    fresh = run_ranks(_load_then_continue_fresh, 2, cfg, second)[0]
    assert fresh["actor/pg_loss"] != pytest.approx(uninterrupted["actor/pg_loss"], rel=1e-4)
    # DCP reshards: the 2-rank checkpoint loads into a single process
    (single, _), = run_ranks(_load_then_continue, 1, cfg, [_merged(second)], path)
    assert single["actor/pg_loss"] == pytest.approx(uninterrupted["actor/pg_loss"], rel=1e-4)


def _merged(shards):
    from toolrl.batch import concat, select_rows

    full = concat(shards)
    return select_rows(full, [0, 1, 4, 5, 2, 3, 6, 7])


def _load_then_continue_fresh(rank, cfg, second):
    return FSDPActor(cfg).update(second[rank])


def _train_and_export(rank, cfg, shards, path):
    actor = FSDPActor(cfg)
    actor.update(shards[rank])
    out = actor.export_hf(path)
    return out, actor.compute_log_prob(shards[rank])[OLD_LOG_PROBS]


def test_export_hf_loads_in_transformers_with_the_same_outputs(tiny_model_dir, batches,
                                                                tmp_path):
    cfg = _cfg(tiny_model_dir)
    path = tmp_path / "hf"
    results = run_ranks(_train_and_export, 2, cfg, split(batches[0], 2), str(path))
    assert results[0][0] == path and results[1][0] is None  # rank 0 writes
    trained = torch.cat([results[0][1], results[1][1]])
    from transformers import AutoTokenizer

    exported = hf_log_probs(path, batches[0])
    torch.testing.assert_close(exported, trained, atol=2e-5, rtol=1e-5)
    assert not torch.allclose(exported, hf_log_probs(tiny_model_dir, batches[0]), atol=1e-3)
    with safe_open(str(path / "model.safetensors"), framework="pt") as fh:
        names = set(fh.keys())
    with safe_open(str(tiny_model_dir / "model.safetensors"), framework="pt") as fh:
        assert names == set(fh.keys())  # tied lm_head.weight dropped, as in the original
    assert json.loads((path / "config.json").read_text())["tie_word_embeddings"] is True
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
