"""FSDP2 actor on CPU (gloo): log-probs, data-parallel gradient equivalence, update, ref."""

from __future__ import annotations

import pytest
import torch
from fsdp_harness import hf_log_probs, make_batch, run_ranks, with_policy_inputs

from toolrl.algo.loss import PolicyLossConfig
from toolrl.batch import (
    EPISODE,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    RESPONSE_MASK,
    concat,
    select_rows,
    split,
)
from toolrl.workers.actor import ENTROPY, ActorConfig, FSDPActor, FSDPReference
from toolrl.workers.base import lr_lambda
from toolrl.workers.fsdp import full_gradients

N = 8


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    return with_policy_inputs(tiny_model_dir, make_batch(N, seed=3))


def _config(model_dir, **kw) -> ActorConfig:
    return ActorConfig(model_path=str(model_dir), lr=1e-4, **kw)


def _gradients(rank: int, cfg: ActorConfig, shards: list) -> tuple[dict, dict]:
    actor = FSDPActor(cfg)
    metrics = actor.compute_gradients(shards[rank])
    return full_gradients(actor.model), metrics


LOSS = PolicyLossConfig(entropy_coeff=0.01, kl_loss_coef=0.1, kl_loss_kind="k3",
                        corrections=[{"name": "tis", "cap": 2.0}, {"name": "icepop"}],
                        clip_ratio_high=0.28)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_two_ranks_give_single_process_gradients(tiny_model_dir, batch, agg):
    """2-rank FSDP2 with uneven micro-batches (fixed 3+1 with gradient checkpointing, or
    token-budget packing with padding removed) accumulates exactly the gradients of one process
    on the whole batch (PPO clip-higher + dual-clip, TIS, entropy bonus and KL loss on)."""
    loss = PolicyLossConfig(**{**LOSS.__dict__, "loss_agg_mode": agg})
    (single, m1), = run_ranks(_gradients, 1, _config(tiny_model_dir, loss=loss), [batch])
    shards = split(batch, 2)
    assert shards[0][RESPONSE_MASK].sum() != shards[1][RESPONSE_MASK].sum()  # unequal tokens
    for extra in ({"micro_batch_size": 3, "gradient_checkpointing": True},
                  {"max_tokens_per_micro_batch": 40, "use_remove_padding": True}):
        cfg = _config(tiny_model_dir, loss=loss, **extra)
        (g0, m0), (g1, _) = run_ranks(_gradients, 2, cfg, shards)
        assert set(g0) == set(single) and len(single) > 10
        for name, grad in single.items():
            assert grad.abs().max() > 0, name
            torch.testing.assert_close(g0[name], grad, atol=1e-6, rtol=1e-5, msg=name)
            torch.testing.assert_close(g1[name], g0[name], atol=0, rtol=0)
        for key in ("loss", "pg_loss", "pg_clipfrac", "entropy", "kl_ref"):
            assert m0[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key


def _schedule(rank: int, cfg: ActorConfig, per_rank: list):
    actor = FSDPActor(cfg)
    return [(actor.update(td), actor.schedule_pos) for td in per_rank[rank]]


def test_the_lr_schedule_moves_one_trainer_step_per_update_whatever_the_batch_size(
        tiny_model_dir, batch):
    """With ``updates_per_step`` (the trainer's plan: 2 epochs x 2 mini-batches of 4), an
    update moves the cosine schedule by 4 optimizer steps whether its batch makes 4, 8 or 2
    of them (per-turn samples, split or dropped ones): three updates end the schedule, where
    counting optimizer steps would end it in the second."""
    cfg = _config(tiny_model_dir, ppo_epochs=2, ppo_mini_batch_size=4, lr_schedule="cosine",
                  total_steps=12, updates_per_step=4)
    big = concat([batch, batch])  # 16 rows: 8 optimizer steps
    small = select_rows(batch, [0, 1, 2, 3])  # 4 rows: 2 optimizer steps
    (first, p1), (second, p2), (third, p3) = run_ranks(_schedule, 1, cfg,
                                                        [[batch, big, small]])[0]
    assert (p1, p2, p3) == (4.0, 8.0, 12.0)
    assert [h["actor/num_updates"] for h in (first, second, third)] == [4.0, 12.0, 14.0]
    factor = lr_lambda(cfg)
    assert first["actor/lr"] == pytest.approx(1e-4 * factor(3))  # as counted before
    assert second["actor/lr"] == pytest.approx(1e-4 * factor(4 + 4 * 7 / 8))
    assert third["actor/lr"] == pytest.approx(1e-4 * factor(10))
    assert factor(p3) == 0.0 < third["actor/lr"]  # the run's last update ends the schedule


def _updates(rank: int, cfg: ActorConfig, per_rank: list):
    return [FSDPActor(cfg).update(td) for td in per_rank[rank]]


def test_a_mini_batch_counts_episodes_not_their_rows(tiny_model_dir, batch):
    """Rows of one episode (``episode``: the per_turn history policy's samples of it) train in
    one mini-batch and count once: 8 rows in 4 episodes make 2 mini-batches of 2 where 8
    one-row episodes make 4; one episode of all 8 rows is one update, the same as the whole
    batch as one mini-batch."""
    cfg = _config(tiny_model_dir, ppo_mini_batch_size=2, shuffle=True, seed=1)
    paired = batch.clone()
    paired.set(EPISODE, torch.tensor([1, 1, 3, 3, 5, 5, 7, 7]))
    whole = batch.clone()
    whole.set(EPISODE, torch.full((N,), 7))
    rows, episodes, one = run_ranks(_updates, 1, cfg, [[batch, paired, whole]])[0]
    assert (rows["actor/num_updates"], episodes["actor/num_updates"]) == (4.0, 2.0)
    assert one["actor/num_updates"] == 1.0
    (alone,), = run_ranks(_updates, 1, _config(tiny_model_dir, seed=1), [[batch]])
    assert alone["actor/num_updates"] == 1.0
    for key in ("loss", "pg_loss", "entropy", "grad_norm"):
        assert one[f"actor/{key}"] == pytest.approx(alone[f"actor/{key}"], rel=1e-6), key


def _log_probs(rank: int, cfg: ActorConfig, td):
    actor = FSDPActor(cfg)
    ref = FSDPReference(cfg)
    out = actor.compute_log_prob(td, with_entropy=True)
    return out[OLD_LOG_PROBS], out[ENTROPY], ref.compute_ref_log_prob(td)[REF_LOG_PROBS]


@pytest.mark.parametrize("extra", [
    {"micro_batch_size": 3},
    {"max_tokens_per_micro_batch": 30, "use_remove_padding": True, "temperature": 0.7},
])
def test_log_probs_match_transformers(tiny_model_dir, batch, extra):
    cfg = _config(tiny_model_dir, **extra)
    (lp, ent, ref), = run_ranks(_log_probs, 1, cfg, batch)
    expected = hf_log_probs(tiny_model_dir, batch, temperature=cfg.temperature)
    assert lp.shape == expected.shape == batch[RESPONSE_MASK].shape
    torch.testing.assert_close(lp, expected, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ref, lp, atol=0, rtol=0)
    resp_attn = batch["attention_mask"][:, -lp.shape[1]:].bool()
    assert bool((ent[resp_attn] > 0).all()) and bool((ent[~resp_attn] == 0).all())
    assert bool((lp[~resp_attn] == 0).all())


def _train(rank: int, cfg: ActorConfig, shards: list, steps: int):
    actor = FSDPActor(cfg)
    td = shards[rank]
    history = [actor.update(td) for _ in range(steps)]
    return history, actor.compute_log_prob(td)[OLD_LOG_PROBS]


def test_update_two_ranks_matches_single_process(tiny_model_dir, batch):
    """Several PPO updates (2 epochs x 2 mini-batches, warmup, clipping) on 2 ranks give the
    same losses as one process, and the policy moves towards positive advantages."""
    cfg = _config(tiny_model_dir, ppo_epochs=2, ppo_mini_batch_size=4, micro_batch_size=2,
                  warmup_steps=5, grad_clip=1.0)
    shards = split(batch, 2)
    two = run_ranks(_train, 2, cfg, shards, 3)
    # global mini-batch k = local mini-batch k of every rank: rows 0,1,4,5 then 2,3,6,7
    order = [0, 1, 4, 5, 2, 3, 6, 7]
    one, = run_ranks(_train, 1, cfg, [select_rows(batch, order)], 3)
    hist1, hist2 = one[0], two[0][0]
    assert hist2 == two[1][0]  # every rank reports the same reduced metrics
    assert [h["actor/num_updates"] for h in hist1] == [4.0, 8.0, 12.0]
    # linear warmup over 5 steps: the 4th step of the first update runs at 4/6 of the lr
    assert hist1[0]["actor/lr"] == pytest.approx(1e-4 * 4 / 6)
    assert hist1[2]["actor/lr"] == pytest.approx(1e-4)
    for h1, h2 in zip(hist1, hist2, strict=True):
        assert h2["actor/pg_loss"] == pytest.approx(h1["actor/pg_loss"], rel=1e-3, abs=1e-5)
        assert h2["actor/grad_norm"] == pytest.approx(h1["actor/grad_norm"], rel=1e-3)
    # PPO ascends the advantage-weighted log-likelihood
    b = select_rows(batch, order)
    old, new = b[OLD_LOG_PROBS], one[1]
    adv, mask = b["advantages"], b[RESPONSE_MASK].float()
    assert ((new - old) * adv * mask).sum() > 0
