"""The same engine on the CUDA build of vLLM (``backend="gpu"``); skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from toolrl.rollout.engine import EngineConfig, SamplingConfig, VLLMEngine

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = VLLMEngine(EngineConfig(model=str(tiny_model_dir), backend="gpu", dtype="float32",
                                  max_model_len=512, kv_cache_gib=None,
                                  gpu_memory_utilization=0.2))
    yield eng
    eng.shutdown()


def test_gpu_generate_and_weight_push_round_trip(engine, tiny_model_dir):
    prompt = [1, 494, 201, 588, 590, 324]
    greedy = SamplingConfig(temperature=0.0, max_tokens=16, ignore_eos=True)
    [before] = engine.generate_sync(prompt, greedy)
    assert len(before.token_ids) == 16 and len(before.log_probs) == 16
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in hf.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]
    engine.load_weights_sync(perturbed.items())
    [after] = engine.generate_sync(prompt, greedy)
    assert after.token_ids != before.token_ids
    hf.load_state_dict(perturbed)
    ids = torch.tensor([prompt + after.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(hf(ids).logits[0, len(prompt) - 1: -1].float(), -1)
    hf_lp = logp[torch.arange(16), torch.tensor(after.token_ids)]
    assert (hf_lp - torch.tensor(after.log_probs)).abs().max() < 1e-3  # GPU kernels differ
    engine.load_weights_sync(original.items())
    [restored] = engine.generate_sync(prompt, greedy)
    assert restored.token_ids == before.token_ids


def test_a_cpu_backend_on_the_gpu_build_is_a_clear_error(tiny_model_dir):
    from toolrl.rollout.engine import EngineError

    with pytest.raises(EngineError, match="backend='cpu'"):
        VLLMEngine(EngineConfig(model=str(tiny_model_dir), backend="cpu"))
