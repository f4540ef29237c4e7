"""End to end: a LoRA actor's policy reaches a real vLLM CPU engine, both ways
(``merge``: full weights with the adapter merged in; ``adapter``: vLLM's LoRA support)."""

from __future__ import annotations

import pytest
import torch
from fsdp_harness import make_batch, run_ranks, with_policy_inputs

from toolrl.batch import OLD_LOG_PROBS, build_rollout_batch
from toolrl.rollout.engine import EngineConfig, EngineError, SamplingConfig, VLLMEngine
from toolrl.weights import canary
from toolrl.weights.engine_routes import EngineWeightRoutes
from toolrl.workers.actor import ActorConfig, FSDPActor
from toolrl.workers.lora import LoraConfig


def _greedy(engine, prompt):
    out = engine.generate_sync(prompt, SamplingConfig(temperature=0.0, max_tokens=16,
                                                      ignore_eos=True), timeout=120)[0]
    return out.token_ids, torch.tensor(out.log_probs)


def _scored(actor, prompt, ids):
    batch = build_rollout_batch([prompt], [ids], [[1] * len(ids)], pad_token_id=0)
    return actor.compute_log_prob(batch)[OLD_LOG_PROBS][0]


def _push_and_probe(rank, model_dir, sync, td, prompt, out_dir):
    lora = LoraConfig(rank=8, alpha=32.0, target_modules=("q_proj", "v_proj", "gate_proj"),
                      sync=sync)
    actor = FSDPActor(ActorConfig(model_path=model_dir, lr=2e-2, lora=lora))
    for _ in range(3):
        actor.update(td)  # move the adapter well away from B = 0
    engine = VLLMEngine(EngineConfig(model=model_dir, max_model_len=128, kv_cache_gib=0.25,
                                     multiprocessing=False, seed=0, weight_bucket_mb=0.25,
                                     max_lora_rank=lora.engine_rank if sync == "adapter" else 0))
    try:
        before_ids, before_lp = _greedy(engine, prompt)
        stale = _scored(actor, prompt, before_ids)
        versions = [actor.weights.push_local([engine.weights]) for _ in range(2)]  # two versions
        after_ids, after_lp = _greedy(engine, prompt)
        trained = _scored(actor, prompt, after_ids)
        actor.export_hf(f"{out_dir}/adapter")
        actor.export_hf(f"{out_dir}/merged", merged=True)
        return (before_lp, stale, after_ids, after_lp, trained, versions,
                engine.weight_version)
    finally:
        engine.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["merge", "adapter"])
def test_engine_follows_the_adapter_after_a_sync(tiny_model_dir, tmp_path, sync):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    td = with_policy_inputs(tiny_model_dir, make_batch(8, seed=4), noise=0.0)
    td["advantages"] = td["advantages"].sign() * td["response_mask"]
    prompt = td["input_ids"][0][td["attention_mask"][0].bool()][:6].tolist()
    before_lp, stale, after_ids, after_lp, trained, versions, engine_version = run_ranks(
        _push_and_probe, 1, str(tiny_model_dir), sync, td, prompt, str(tmp_path),
        timeout_s=300)[0]
    assert versions == [1, 2] and engine_version == 2
    # the canary's check: before the push the engine disagreed with the actor, after it agrees
    mask = torch.ones_like(after_lp)
    bound = canary.tolerance("float32")
    assert canary.probe_diff(before_lp, stale, mask) > 10 * bound
    assert canary.probe_diff(after_lp, trained, mask) < 1e-4
    # greedy output follows the adapter: transformers + PEFT on the exported adapter, and the
    # exported merged model, generate exactly what the engine generated
    ids = torch.tensor([prompt])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with_adapter = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    for model in (with_adapter, merged):
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=16, do_sample=False, min_new_tokens=16,
                                 pad_token_id=0)
        assert out[0, len(prompt):].tolist() == list(after_ids)


def test_adapter_push_into_an_engine_without_lora_is_a_clear_error():
    engine = VLLMEngine.__new__(VLLMEngine)  # no vLLM start: the check comes first
    engine.config = EngineConfig(model="unused")
    engine._loop = type("L", (), {"on_loop": staticmethod(lambda: False)})()
    with pytest.raises(EngineError, match="without LoRA support"):
        EngineWeightRoutes(engine).load_adapter_sync("/nowhere", 1)
    with pytest.raises(ValueError, match="max_lora_rank"):
        EngineConfig(model="m", max_lora_rank=12)
