"""The GPU path (NCCL, CUDA placement, bf16 mixed precision); skipped without a GPU."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from fsdp_harness import hf_log_probs, make_batch, run_ranks, with_policy_inputs

from toolrl.batch import OLD_LOG_PROBS
from toolrl.workers.actor import ActorConfig, FSDPActor

pytestmark = pytest.mark.gpu


def _actor_on_gpu(rank, model_dir, td, path):
    cfg = ActorConfig(model_path=model_dir, param_dtype="bfloat16", reduce_dtype="float32",
                      lr=1e-4, max_tokens_per_micro_batch=64, use_remove_padding=True)
    actor = FSDPActor(cfg)
    device = next(actor.model.parameters()).device.type
    log_probs = actor.compute_log_prob(td)[OLD_LOG_PROBS]
    metrics = actor.update(td)
    actor.export_hf(path)
    return dist.get_backend(), device, log_probs, metrics


def test_nccl_actor_with_bf16_mixed_precision(tiny_model_dir, tmp_path):
    td = with_policy_inputs(tiny_model_dir, make_batch(8, seed=3))
    backend, device, log_probs, metrics = run_ranks(
        _actor_on_gpu, 1, str(tiny_model_dir), td, str(tmp_path / "hf"),
        device="cuda", timeout_s=600)[0]
    assert "nccl" in backend and device == "cuda"
    torch.testing.assert_close(log_probs, hf_log_probs(tiny_model_dir, td), atol=0.1, rtol=0.05)
    assert math.isfinite(metrics["actor/grad_norm"]) and metrics["actor/grad_norm"] > 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()
