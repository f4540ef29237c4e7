"""A bucketed weight push into the real CPU engine, on a model whose push takes many buckets:
the real Qwen vocabulary (151,936 rows, tied embeddings) on a small trunk, 0.5 MiB buckets."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from toolrl.models.tiny import build_tiny_model
from toolrl.rollout.engine import EngineConfig, EngineError, SamplingConfig, VLLMEngine
from toolrl.weights.staging import STAGING_PREFIX, bucket_plan, staging_dir

pytestmark = pytest.mark.slow

REAL_VOCAB = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 128,
              "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "tie_word_embeddings": True,
              "max_position_embeddings": 1024, "rope_theta": 10000.0}
BUCKET_MB = 0.5
PROMPT = [1, 494, 201, 588, 590, 324, 77, 12]
GREEDY = SamplingConfig(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("real_vocab") / "m", config=REAL_VOCAB,
                            dtype="float32")


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = VLLMEngine(EngineConfig(model=str(model_dir), max_model_len=256, kv_cache_gib=0.25,
                                  multiprocessing=False, weight_bucket_mb=BUCKET_MB, seed=0))
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def hf(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_log_probs(model, prompt: list[int], sampled: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + sampled])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1: -1].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(sampled)), torch.tensor(sampled)]


def _perturbed(hf, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {k: v + 0.05 * torch.randn(v.shape, generator=gen)
           for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    return out


def _my_staging_files() -> list[str]:
    return [p.name for p in staging_dir().glob(f"{STAGING_PREFIX}{os.getpid()}-*")]


def test_multi_bucket_push_matches_transformers_and_restores(engine, hf):
    assert hf.config.vocab_size == 151936 and hf.config.tie_word_embeddings
    original = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    [before] = engine.generate_sync(PROMPT, GREEDY)
    weights = _perturbed(hf, 0)
    expected = bucket_plan([(n, t.dtype, tuple(t.shape)) for n, t in weights.items()],
                           int(BUCKET_MB * 2**20))
    assert len(expected) > 8  # the embedding alone, then the layers over many buckets

    # a lazy stream: when each tensor is pulled, at most the bucket being filled is staged
    staged_when_pulled = []

    def stream():
        for name, t in weights.items():
            staged_when_pulled.append(len(_my_staging_files()))
            yield name, t

    version = engine.weights.load_weights_sync(stream())
    assert version == engine.weight_version
    assert engine.weights.last_push_buckets == len(expected)
    assert max(staged_when_pulled) <= 1 and _my_staging_files() == []

    # the engine computes with the pushed weights: log-probs equal transformers' (the tied
    # lm_head's CPU-packed copy is rebuilt after a bucketed push too)
    hf.load_state_dict({**weights, "lm_head.weight": weights["model.embed_tokens.weight"]})
    try:
        [after] = engine.generate_sync(PROMPT, GREEDY)
        assert after.token_ids != before.token_ids
        diff = (hf_log_probs(hf, PROMPT, after.token_ids) - torch.tensor(after.log_probs))
        assert diff.abs().max() < 1e-4, diff
        [sampled] = engine.generate_sync(PROMPT, SamplingConfig(max_tokens=16, seed=3,
                                                                ignore_eos=True))
        diff = (hf_log_probs(hf, PROMPT, sampled.token_ids) - torch.tensor(sampled.log_probs))
        assert diff.abs().max() < 1e-4, diff
    finally:
        hf.load_state_dict(original)

    engine.weights.load_weights_sync(original)  # a mapping works too
    [restored] = engine.generate_sync(PROMPT, GREEDY)
    assert restored.token_ids == before.token_ids
    assert restored.log_probs == pytest.approx(before.log_probs, abs=1e-6)


def test_an_incomplete_stream_is_reported_and_a_full_push_recovers(engine, hf):
    [before] = engine.generate_sync(PROMPT, GREEDY)
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    partial = ((k, v + 0.1) for k, v in state.items() if "layers.3." not in k)
    with pytest.raises(EngineError, match="mix of old and new weights"):
        engine.weights.load_weights_sync(partial)
    assert _my_staging_files() == []
    engine.weights.load_weights_sync(state.items())
    [after] = engine.generate_sync(PROMPT, GREEDY)
    assert after.token_ids == before.token_ids
    assert after.log_probs == pytest.approx(before.log_probs, abs=1e-6)
