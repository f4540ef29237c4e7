"""FSDP2 critic: values on response tokens, data-parallel gradients, learning the returns."""

from __future__ import annotations

import torch
from fsdp_harness import make_batch, run_ranks

from toolrl.batch import RESPONSE_MASK, RETURNS, VALUES, split
from toolrl.workers.critic import CriticConfig, FSDPCritic
from toolrl.workers.fsdp import full_gradients


def _batch():
    td = make_batch(8, seed=11)
    mask = td[RESPONSE_MASK].float()
    g = torch.Generator().manual_seed(0)
    td[RETURNS] = (torch.randn(8, 1, generator=g) + torch.linspace(0, 1, mask.shape[1])) * mask
    return td


def _values_and_grads(rank, cfg, shards):
    critic = FSDPCritic(cfg)
    td = shards[rank]
    td[VALUES] = critic.compute_values(td)[VALUES]
    packed = FSDPCritic(CriticConfig(**{**cfg.__dict__, "use_remove_padding": True}))
    metrics = critic.compute_gradients(td)
    return td[VALUES], packed.compute_values(td)[VALUES], full_gradients(critic.model), metrics


def test_values_and_two_rank_gradients(tiny_model_dir):
    td = _batch()
    cfg = CriticConfig(model_path=str(tiny_model_dir), micro_batch_size=3, cliprange_value=0.2)
    (v, v_packed, single, m1), = run_ranks(_values_and_grads, 1, cfg, [td])
    resp_attn = td["attention_mask"][:, -v.shape[1]:].bool()
    assert v.shape == td[RESPONSE_MASK].shape and bool((v[~resp_attn] == 0).all())
    assert v[resp_attn].std() > 0
    torch.testing.assert_close(v_packed, v, atol=2e-5, rtol=1e-5)
    out = run_ranks(_values_and_grads, 2, cfg, split(td, 2))
    torch.testing.assert_close(torch.cat([out[0][0], out[1][0]]), v, atol=1e-6, rtol=1e-6)
    grads, m2 = out[0][2], out[0][3]
    assert "score.weight" in grads and set(grads) == set(single)
    for name, grad in single.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert abs(m2["vf_loss"] - m1["vf_loss"]) < 1e-6


def _fit(rank, cfg, td, steps):
    critic = FSDPCritic(cfg)
    losses = []
    for _ in range(steps):
        td[VALUES] = critic.compute_values(td)[VALUES]
        losses.append(critic.update_critic(td)["critic/vf_loss"])
    return losses


def test_critic_learns_the_returns(tiny_model_dir):
    cfg = CriticConfig(model_path=str(tiny_model_dir), lr=3e-3, cliprange_value=None,
                       ppo_epochs=2)
    losses = run_ranks(_fit, 1, cfg, _batch(), 6)[0]
    assert losses[-1] < 0.5 * losses[0]
