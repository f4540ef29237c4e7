"""Lean scoring of response tokens: every layout and chunking gives the padded forward's
log-probs, entropies and gradients; shared prompts run once; FSDP2 ranks agree."""

from __future__ import annotations

import pytest
import torch
from fsdp_harness import hf_log_probs, make_batch, run_ranks, with_policy_inputs
from transformers import AutoModelForCausalLM

from toolrl.algo.loss import PolicyLossConfig
from toolrl.batch import RESPONSE_MASK, build_rollout_batch, split
from toolrl.workers.actor import ActorConfig, FSDPActor
from toolrl.workers.fsdp import full_gradients
from toolrl.workers.micro_batch import plan_micro_batches
from toolrl.workers.scoring import (
    enable_scoring,
    prompt_groups,
    resolve_layout,
    score_responses,
)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return enable_scoring(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval())


@pytest.fixture(scope="module")
def grouped():
    return make_batch(12, seed=5, group_size=4)


def _grads(model, td, layout, chunk_size=None, temperature=1.0):
    model.zero_grad(set_to_none=True)
    lp, ent = score_responses(model, td, layout=layout, chunk_size=chunk_size,
                              with_entropy=True, entropy_grad=True, temperature=temperature)
    mask = td[RESPONSE_MASK].float()
    weights = torch.linspace(-1, 1, lp.numel()).reshape(lp.shape)  # a loss that uses every token
    ((lp * weights * mask).sum() + 0.1 * (ent * mask).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), grads


def test_rows_sharing_a_prompt_form_one_group(grouped):
    assert prompt_groups(grouped).tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert resolve_layout("auto", grouped, cache_ok=True) == "shared_prefix"
    assert resolve_layout("auto", grouped, cache_ok=False) == "padded"
    assert resolve_layout("auto", make_batch(4, seed=1), cache_ok=True) == "padded"
    # where the packed row would take torch's varlen kernel, auto packs, checkpointing or not
    for cache_ok in (True, False):
        assert resolve_layout("auto", grouped, cache_ok, varlen_ok=True) == "packed"
    assert resolve_layout("padded", grouped, cache_ok=True, varlen_ok=True) == "padded"
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        resolve_layout("shared_prefix", grouped, cache_ok=False)
    with pytest.raises(ValueError, match="unknown forward layout"):
        resolve_layout("dense", grouped, cache_ok=True)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_every_layout_gives_the_reference_log_probs(model, tiny_model_dir, grouped, temperature):
    reference = hf_log_probs(tiny_model_dir, grouped, temperature)
    mask = grouped["attention_mask"][:, -grouped["responses"].shape[1]:].bool()
    with torch.no_grad():
        for layout in ("padded", "packed", "shared_prefix"):
            lp, _ = score_responses(model, grouped, layout=layout, temperature=temperature)
            torch.testing.assert_close(lp[mask], reference[mask], atol=2e-5, rtol=1e-5,
                                       msg=layout)
            assert (lp[~mask] == 0).all()


def test_shared_prefix_and_chunks_give_the_padded_gradients(model, grouped):
    """The prompt's share of the gradient flows through the cache: same gradients as running
    every row whole; LM-head chunks (recomputed in backward) change nothing either."""
    lp0, ent0, g0 = _grads(model, grouped, "padded")
    for layout, chunk in (("shared_prefix", None), ("shared_prefix", 7), ("padded", 5),
                          ("packed", 3)):
        lp, ent, g = _grads(model, grouped, layout, chunk)
        torch.testing.assert_close(lp, lp0, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(ent, ent0, atol=2e-6, rtol=1e-5)
        assert set(g) == set(g0)
        for name, grad in g0.items():  # float32 sums in another order: relative to the scale
            torch.testing.assert_close(g[name], grad, atol=2e-6 * float(grad.abs().max()),
                                       rtol=1e-4, msg=f"{layout}/{chunk}: {name}")


def test_shared_prefix_gradients_are_bit_reproducible_on_several_threads(model):
    """Rows of one prompt sum their gradient into its K/V in a fixed order: the same batch gives
    the same bits every time (a warm start or a seed's run must not drift with thread timing)."""
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 4096, (150,), generator=g).tolist()  # long enough to split work
    responses = [torch.randint(3, 4096, (10 + 2 * i,), generator=g).tolist() for i in range(16)]
    one_prompt = build_rollout_batch([prompt] * 16, responses, [[1] * len(r) for r in responses],
                                     pad_token_id=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = [_grads(model, one_prompt, "shared_prefix")[2] for _ in range(4)]
    finally:
        torch.set_num_threads(threads)
    for grads in runs[1:]:
        for name, grad in runs[0].items():
            assert torch.equal(grads[name], grad), name


def test_chunked_log_probs_equal_unchunked_exactly_enough(model, grouped):
    with torch.no_grad():
        whole, ent_whole = score_responses(model, grouped, with_entropy=True)
        for chunk in (1, 4, 1000):
            lp, ent = score_responses(model, grouped, with_entropy=True, chunk_size=chunk)
            torch.testing.assert_close(lp, whole, atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(ent, ent_whole, atol=1e-6, rtol=1e-6)


def test_token_budget_micro_batches_keep_a_prompt_group_together(grouped):
    units = prompt_groups(grouped)
    plan = plan_micro_batches(grouped, max_tokens=60, sync=False, units=units)
    assert sorted(r for part in plan for r in part) == list(range(12))
    for part in plan:
        assert len({int(units[r]) for r in part}) * 4 == len(part)


def _actor_gradients(rank, cfg, shards):
    actor = FSDPActor(cfg)
    metrics = actor.compute_gradients(shards[rank])
    return full_gradients(actor.model), metrics


def test_two_fsdp_ranks_sharing_prompts_give_single_process_gradients(tiny_model_dir):
    """2-rank FSDP2 with shared prompts and token-budget micro-batches (the trunk runs twice in
    one root forward) accumulates the gradients of one process running every row whole."""
    batch = with_policy_inputs(tiny_model_dir, make_batch(16, seed=7, group_size=4))
    loss = PolicyLossConfig(entropy_coeff=0.01, clip_ratio_high=0.28)
    whole = ActorConfig(model_path=str(tiny_model_dir), lr=1e-4, loss=loss, share_prompts=False)
    (single, m1), = run_ranks(_actor_gradients, 1, whole, [batch])
    shared = ActorConfig(model_path=str(tiny_model_dir), lr=1e-4, loss=loss,
                         max_tokens_per_micro_batch=70, logits_chunk_size=9)
    (g0, m0), (g1, _) = run_ranks(_actor_gradients, 2, shared, split(batch, 2))
    for name, grad in single.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(g0[name], grad, atol=2e-6 * float(grad.abs().max()),
                                   rtol=1e-4, msg=name)
        torch.testing.assert_close(g1[name], g0[name], atol=0, rtol=0)
    for key in ("loss", "pg_loss", "entropy"):
        assert m0[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("layout", ["padded", "packed", "shared_prefix"])
def test_every_scoring_tensor_lives_on_the_micro_batchs_device(model, grouped, layout):
    """On a GPU the micro-batch lives on CUDA while a tensor made without ``device=`` lands on
    the CPU; a CPU tensor indexed by CUDA indices raises (issue 35: the padded layout, the
    default, crashed at the first log-prob pass). The CPU stand-in: make "meta" the default
    device, so a tensor created without the micro-batch's device is a meta tensor and any mix
    with the real (CPU) batch fails or gives wrong values."""
    with torch.no_grad():
        expected, _ = score_responses(model, grouped, layout=layout)
    model.zero_grad(set_to_none=True)
    with torch.device("meta"):
        lp, ent = score_responses(model, grouped, layout=layout, chunk_size=7,
                                  with_entropy=True, entropy_grad=True)
        (lp.sum() + ent.sum()).backward()
    assert lp.device.type == "cpu"
    torch.testing.assert_close(lp.detach(), expected, atol=2e-6, rtol=1e-5)
    assert all(p.grad is None or p.grad.device.type == "cpu" for p in model.parameters())
    model.zero_grad(set_to_none=True)
