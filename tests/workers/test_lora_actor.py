"""LoRA actors (PEFT under FSDP2): what trains, the reference, checkpoints, exports."""

from __future__ import annotations

import pytest
import torch
from fsdp_harness import hf_log_probs, make_batch, run_ranks, with_policy_inputs

from toolrl.batch import OLD_LOG_PROBS, REF_LOG_PROBS, RESPONSE_MASK, split
from toolrl.workers.actor import ActorConfig, FSDPActor
from toolrl.workers.fsdp import full_state_dict
from toolrl.workers.lora import LoraConfig, is_adapter_name

LORA = LoraConfig(rank=8, alpha=16.0, target_modules=("q_proj", "v_proj", "up_proj"))


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    return with_policy_inputs(tiny_model_dir, make_batch(8, seed=3, group_size=2), seed=3)


def _cfg(model_dir, lora=LORA, **kw) -> ActorConfig:
    return ActorConfig(model_path=str(model_dir), lr=1e-2, micro_batch_size=2, lora=lora, **kw)


def test_lora_config_is_validated():
    assert not LoraConfig().enabled
    with pytest.raises(ValueError, match=r"lora\.sync"):
        LoraConfig(rank=4, sync="broadcast")
    with pytest.raises(ValueError, match=r"lora\.rank"):
        LoraConfig(rank=-1)
    with pytest.raises(ValueError, match=r"lora\.alpha is set but lora\.rank is 0"):
        LoraConfig(alpha=8.0)
    with pytest.raises(ValueError, match="dropout"):
        LoraConfig(rank=4, dropout=1.0)
    assert LoraConfig(rank=4).engine_rank == 8 and LoraConfig(rank=16).engine_rank == 16
    assert ActorConfig(model_path="x", lora={"rank": 4}).lora == LoraConfig(rank=4)


def test_unknown_or_non_linear_targets_are_clear_errors(tiny_model_dir):
    with pytest.raises(ValueError, match="target_modules"):
        FSDPActor(_cfg(tiny_model_dir, lora=LoraConfig(rank=4, target_modules=("nope",))))
    with pytest.raises(ValueError, match="only linear"):
        FSDPActor(_cfg(tiny_model_dir, lora=LoraConfig(rank=4,
                                                       target_modules=("embed_tokens",))))


def _snapshot(model):
    return {k: v.clone() for k, v in full_state_dict(model).items()}  # copies, not views


def _update(rank, cfg, shards, steps):
    actor = FSDPActor(cfg)
    before = _snapshot(actor.model)
    optimized = sum(p.numel() for g in actor.optimizer.param_groups for p in g["params"])
    trainable = {n for n, p in actor.model.named_parameters() if p.requires_grad}
    ref_before = actor.compute_ref_log_prob(shards[rank])[REF_LOG_PROBS]
    lp_before = actor.compute_log_prob(shards[rank])[OLD_LOG_PROBS]
    for _ in range(steps):
        actor.update(shards[rank])
    after = _snapshot(actor.model)
    ref_after = actor.compute_ref_log_prob(shards[rank])[REF_LOG_PROBS]
    lp_after = actor.compute_log_prob(shards[rank])[OLD_LOG_PROBS]
    return (before, after, optimized, trainable, ref_before, ref_after, lp_before, lp_after)


@pytest.mark.parametrize("world", [1, 2])
def test_update_changes_only_adapter_and_ref_is_the_base_model(tiny_model_dir, batch, world):
    shards = split(batch, world)
    (before, after, optimized, trainable, ref_before, ref_after, lp_before,
     lp_after) = run_ranks(_update, world, _cfg(tiny_model_dir), shards, 2)[0]
    adapter = {n for n in before if is_adapter_name(n)}
    assert adapter and trainable == adapter  # q, v, up of 4 layers: A and B each
    assert len(adapter) == 3 * 4 * 2
    # the optimizer holds exactly the adapter parameters (their full size, not the model's)
    assert optimized == sum(before[n].numel() for n in adapter)
    assert optimized < sum(t.numel() for t in before.values()) / 10
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and changed <= adapter  # base weights bit-identical after the updates
    assert {n for n in adapter if ".lora_B." in n} <= changed  # B starts at 0 and moves
    # reference = base model: equal to transformers on the checkpoint, before and after
    mask = shards[0][RESPONSE_MASK].bool()
    base = hf_log_probs(tiny_model_dir, shards[0])
    torch.testing.assert_close(ref_before[mask], base[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ref_after[mask], base[mask], atol=1e-5, rtol=0)
    # B = 0 at the start: the LoRA actor starts as the base model, then leaves it
    torch.testing.assert_close(lp_before[mask], base[mask], atol=1e-5, rtol=0)
    assert (lp_after[mask] - base[mask]).abs().max() > 1e-3
