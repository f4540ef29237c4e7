"""End to end: FSDP2 actor weights pushed in-process into a real vLLM engine (colocated), in
many small buckets."""

from __future__ import annotations

import pytest
import torch
from fsdp_harness import hf_log_probs, make_batch, run_ranks, with_policy_inputs

from toolrl.batch import OLD_LOG_PROBS, build_rollout_batch
from toolrl.rollout.engine import EngineConfig, SamplingConfig, VLLMEngine
from toolrl.workers.actor import ActorConfig, FSDPActor


def _colocated(rank, model_dir, td, prompt):
    actor = FSDPActor(ActorConfig(model_path=model_dir, lr=3e-3))
    for _ in range(2):
        actor.update(td)  # move the weights well away from the checkpoint
    engine = VLLMEngine(EngineConfig(model=model_dir, max_model_len=128, kv_cache_gib=0.25,
                                     multiprocessing=False, seed=0, weight_bucket_mb=0.25))
    try:
        sampling = SamplingConfig(temperature=1.0, max_tokens=24, seed=0, ignore_eos=True)
        before = engine.generate_sync(prompt, sampling, timeout=120)[0]
        version = actor.weights.push_local([engine.weights])
        after = engine.generate_sync(prompt, sampling, timeout=120)[0]
        version_again = actor.weights.push_local([engine.weights])
        batch = build_rollout_batch([prompt], [after.token_ids], [[1] * len(after.token_ids)],
                                    pad_token_id=0)
        trained = actor.compute_log_prob(batch)[OLD_LOG_PROBS][0]
        return (before.token_ids, before.log_probs, torch.tensor(after.log_probs), trained,
                (version, version_again, engine.weight_version), engine.weights.last_push_buckets)
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_engine_samples_from_the_pushed_weights(tiny_model_dir):
    td = with_policy_inputs(tiny_model_dir, make_batch(8, seed=4), noise=0.0)
    td["advantages"] = td["advantages"].sign() * td["response_mask"]
    prompt = td["input_ids"][0][td["attention_mask"][0].bool()][:6].tolist()
    before_ids, before_lp, after_lp, trained, versions, buckets = run_ranks(
        _colocated, 1, str(tiny_model_dir), td, prompt, timeout_s=300)[0]
    assert versions == (1, 2, 2)
    assert buckets > 10  # ~5 MB of weights in 0.25 MiB buckets
    # after the push, the engine's log-probs are the trained actor's
    torch.testing.assert_close(after_lp, trained, atol=1e-4, rtol=1e-4)
    # before it, the engine still served the checkpoint (and differed from the actor)
    base = build_rollout_batch([prompt], [before_ids], [[1] * len(before_ids)], pad_token_id=0)
    torch.testing.assert_close(torch.tensor(before_lp), hf_log_probs(tiny_model_dir, base)[0],
                               atol=1e-4, rtol=1e-4)
    assert (torch.tensor(before_lp) - after_lp).abs().max() > 1e-2
