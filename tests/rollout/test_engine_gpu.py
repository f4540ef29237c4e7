"""The same engine on the CUDA build of vLLM (``backend="gpu"``): weight pushes through vLLM's
CUDA IPC weight transfer in many buckets, one over 4 GiB, sleep mode. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="the GPU engine is vLLM's CUDA build")
from transformers import AutoModelForCausalLM

from toolrl.models.tiny import build_tiny_model
from toolrl.rollout.engine import EngineConfig, SamplingConfig, VLLMEngine
from toolrl.weights.ipc import ipc_bucket_sizes, ipc_buffer_bytes

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = VLLMEngine(EngineConfig(model=str(tiny_model_dir), backend="gpu", dtype="float32",
                                  max_model_len=512, kv_cache_gib=None,
                                  gpu_memory_utilization=0.2, weight_bucket_mb=0.25,
                                  sleep_level=1))
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
    engine.weights.load_weights_sync(perturbed.items())
    # one IPC buffer of the largest tensor (over 0.25 MiB), each bucket filled to its capacity
    assert engine.weights.last_push_buckets == _expected_buckets(perturbed, engine.config)
    [after] = engine.generate_sync(prompt, greedy)
    assert after.token_ids != before.token_ids
    hf.load_state_dict(perturbed)
    ids = torch.tensor([prompt + after.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(hf(ids).logits[0, len(prompt) - 1: -1].float(), -1)
    hf_lp = logp[torch.arange(16), torch.tensor(after.token_ids)]
    assert (hf_lp - torch.tensor(after.log_probs)).abs().max() < 1e-3  # GPU kernels differ
    engine.weights.load_weights_sync(original.items())
    [restored] = engine.generate_sync(prompt, greedy)
    assert restored.token_ids == before.token_ids


def test_a_cpu_backend_on_the_gpu_build_is_a_clear_error(tiny_model_dir):
    from toolrl.rollout.engine import EngineError

    with pytest.raises(EngineError, match="backend='cpu'"):
        VLLMEngine(EngineConfig(model=str(tiny_model_dir), backend="cpu"))


def _expected_buckets(weights, config) -> int:
    """Buckets of a push of ``weights`` (checkpoint order, no tied lm_head) through the IPC
    buffer the engine sizes: the bucket, or the largest tensor where that is larger."""
    sizes = [t.numel() * t.element_size() for k, t in weights.items() if k != "lm_head.weight"]
    return len(ipc_bucket_sizes(sizes, ipc_buffer_bytes(config.weight_bucket_bytes, max(sizes))))


def _hf_log_probs(hf, prompt, sampled):
    ids = torch.tensor([prompt + sampled], device=next(hf.parameters()).device)
    with torch.no_grad():
        logp = torch.log_softmax(hf(ids).logits[0, len(prompt) - 1: -1].float(), -1)
    return logp[torch.arange(len(sampled)), torch.tensor(sampled)].cpu()


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_frees_the_gpu_and_a_push_after_waking_is_served(engine, tiny_model_dir, level):
    prompt = [1, 494, 201, 588, 590, 324]
    greedy = SamplingConfig(temperature=0.0, max_tokens=16, ignore_eos=True)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(level)
    weights = {k: v + 0.05 * torch.randn(v.shape, generator=gen)
               for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    free_awake = torch.cuda.mem_get_info()[0]
    engine.sleep(level)
    assert engine.sleeping == level
    free_asleep = torch.cuda.mem_get_info()[0]
    assert free_asleep - free_awake > 0.1 * torch.cuda.mem_get_info()[1]  # the KV cache went
    engine.wake_up(["weights"])  # the weights first, then the push, then the KV cache
    engine.weights.load_weights_sync(weights.items())
    engine.wake_up(["kv_cache"])
    assert engine.sleeping == 0
    [out] = engine.generate_sync(prompt, greedy)
    hf.load_state_dict({**weights, "lm_head.weight": weights["model.embed_tokens.weight"]})
    assert (_hf_log_probs(hf, prompt, out.token_ids) - torch.tensor(out.log_probs)).abs().max() \
        < 1e-3


def test_a_push_over_4_gib(tmp_path_factory):
    """1.5B parameters in float32: 6.2 GB of weights, once a single msgpack payload that vLLM
    refused; now buckets through one IPC buffer."""
    model = build_tiny_model(tmp_path_factory.mktemp("big") / "m", size="qwen2.5-1.5b",
                             dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).cuda()
    weights = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    assert sum(t.numel() * t.element_size() for t in weights.values()) > 4 * 2**30
    eng = VLLMEngine(EngineConfig(model=str(model), backend="gpu", dtype="float32",
                                  max_model_len=256, kv_cache_gib=None,
                                  gpu_memory_utilization=0.4, enforce_eager=True))
    try:
        prompt = [1, 494, 201, 588, 590, 324]
        with torch.no_grad():
            for t in weights.values():
                t.mul_(1.05)  # new weights the engine has not seen
        eng.weights.load_weights_sync(weights.items())
        assert eng.weights.last_push_buckets == _expected_buckets(weights, eng.config)
        [out] = eng.generate_sync(prompt, SamplingConfig(temperature=0.0, max_tokens=8,
                                                         ignore_eos=True))
        diff = (_hf_log_probs(hf, prompt, out.token_ids) - torch.tensor(out.log_probs)).abs()
        assert diff.max() < 1e-3
    finally:
        eng.shutdown()
