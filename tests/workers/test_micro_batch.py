"""Pure pieces of the workers: micro-batch plans, input packing, configs, LR schedule."""

from __future__ import annotations

import pytest
import torch
from fsdp_harness import make_batch

from toolrl.batch import RESPONSES
from toolrl.workers.actor import ActorConfig
from toolrl.workers.base import FSDPConfig, lr_lambda
from toolrl.workers.critic import CriticConfig
from toolrl.workers.forward import micro_inputs
from toolrl.workers.micro_batch import (
    balanced_partitions,
    count_bins,
    fixed_partitions,
    plan_micro_batches,
    sequence_lengths,
)


def test_token_budget_packing():
    lengths = [30, 5, 22, 8, 17, 3, 40]
    k = count_bins(lengths, 45)
    assert k == 3  # first-fit decreasing: 40+5 | 30+8+3 | 22+17
    parts = balanced_partitions(lengths, k)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert all(p == sorted(p) for p in parts) and all(parts)
    loads = [sum(lengths[i] for i in p) for p in parts]
    assert max(loads) - min(loads) <= max(lengths)
    assert count_bins([100, 1], 10) == 2  # an over-long sample gets a bin of its own
    with pytest.raises(ValueError, match="non-empty"):
        balanced_partitions([1, 2], 3)
    assert fixed_partitions(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]


def test_plan_uses_real_token_counts():
    td = make_batch(6, seed=1)
    lengths = sequence_lengths(td)
    plan = plan_micro_batches(td, max_tokens=max(lengths) + 1, sync=False)
    assert sorted(i for p in plan for i in p) == list(range(6))
    assert len(plan) == count_bins(lengths, max(lengths) + 1)
    assert plan_micro_batches(td, micro_batch_size=4, sync=False) == [[0, 1, 2, 3], [4, 5]]
    assert plan_micro_batches(td, sync=False) == [list(range(6))]


@pytest.mark.parametrize("packed", [False, True])
def test_micro_inputs_point_at_the_predicting_positions(packed):
    td = make_batch(5, seed=2)
    mi = micro_inputs(td, remove_padding=packed)
    ids = mi.inputs["input_ids"]
    # the token after every kept position is the response token it predicts
    nxt = ids[0, mi.keep + 1] if packed else ids[:, mi.keep + 1].reshape(-1)
    valid = torch.ones_like(mi.labels, dtype=torch.bool) if packed else mi.valid.reshape(-1)
    assert torch.equal(nxt[valid], mi.labels[valid])
    back = mi.scatter(mi.labels.float())
    resp_attn = td["attention_mask"][:, -td[RESPONSES].shape[1]:].bool()
    assert torch.equal(back[resp_attn], td[RESPONSES][resp_attn].float())
    assert bool((back[~resp_attn] == 0).all())
    if packed:  # only real tokens, one row
        assert ids.shape == (1, int(td["attention_mask"].sum()))
    else:  # columns that are padding in every row are cropped
        attn = mi.inputs["attention_mask"]
        assert bool(attn[:, 0].any()) and bool(attn[:, -1].any())


def test_configs_fail_loudly():
    with pytest.raises(ValueError, match="lr_schedule"):
        FSDPConfig(lr_schedule="linear")
    with pytest.raises(ValueError, match="total_steps"):
        FSDPConfig(lr_schedule="cosine", warmup_steps=5, total_steps=5)
    with pytest.raises(ValueError, match="dtype"):
        ActorConfig(param_dtype="float8")
    with pytest.raises(ValueError, match="temperature"):
        ActorConfig(temperature=0)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        CriticConfig(loss_agg_mode="mean")
    with pytest.raises(ValueError, match="micro_batch_size"):
        ActorConfig(micro_batch_size=0)
    assert ActorConfig(loss={"clip_ratio_high": 0.28}).loss.clip_ratio_high == 0.28


def test_structured_config_round_trip():
    from omegaconf import OmegaConf

    base = OmegaConf.structured(ActorConfig)
    cfg = OmegaConf.merge(base, OmegaConf.from_dotlist(
        ["loss.policy_loss=cispo", "betas=[0.9,0.95]", "max_tokens_per_micro_batch=512"]))
    actor = OmegaConf.to_object(cfg)
    assert isinstance(actor, ActorConfig) and actor.loss.policy_loss == "cispo"
    assert actor.betas == (0.9, 0.95) and actor.max_tokens_per_micro_batch == 512


def test_lr_schedule_warmup_then_cosine():
    f = lr_lambda(FSDPConfig(lr_schedule="cosine", warmup_steps=3, total_steps=13,
                             min_lr_ratio=0.1))
    assert [round(f(s), 4) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(8) == pytest.approx(0.1 + 0.9 * 0.5)
    assert f(13) == pytest.approx(0.1) and f(100) == pytest.approx(0.1)
    g = lr_lambda(FSDPConfig(warmup_steps=0))
    assert g(0) == g(1000) == 1.0
