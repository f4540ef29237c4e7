"""``actor.lora`` in the experiment config: validation and what the trainer fills in."""

from __future__ import annotations

import pytest

from toolrl.trainer.config import ConfigError, load_config, worker_rollout_config

QUICKSTART = "configs/quickstart.yaml"


def test_lora_is_off_by_default_and_the_engine_has_no_lora():
    cfg = load_config(QUICKSTART)
    assert not cfg.actor.lora.enabled
    assert worker_rollout_config(cfg).engine.max_lora_rank == 0


@pytest.mark.parametrize("sync, rank, engine_rank", [("adapter", 4, 8), ("adapter", 16, 16),
                                                     ("merge", 4, 0)])
def test_adapter_sync_builds_engines_with_lora_support(sync, rank, engine_rank):
    cfg = load_config(QUICKSTART, [f"actor.lora.rank={rank}", f"actor.lora.sync={sync}",
                                   "actor.lora.target_modules=[q_proj,v_proj]"])
    assert cfg.actor.lora.target_modules == ("q_proj", "v_proj")
    assert worker_rollout_config(cfg).engine.max_lora_rank == engine_rank


@pytest.mark.parametrize("overrides, message", [
    (["actor.lora.alpha=8"], r"actor\.lora\.alpha is set but actor\.lora\.rank is 0"),
    (["actor.lora.rank=4", "actor.lora.sync=broadcast"], r"actor\.lora\.sync='broadcast'"),
    (["actor.lora.rank=4", "actor.lora.sync=adapter", "trainer.mode=pipeline"],
     r"colocated engines only"),
    (["actor.lora.rank=1024", "actor.lora.sync=adapter"], r"above vLLM's largest LoRA rank"),
    (["rollout.engine.max_lora_rank=8"], r"set by the trainer from actor\.lora"),
])
def test_bad_lora_settings_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(QUICKSTART, overrides)


def test_memory_plan_counts_adapters_not_the_base_and_no_second_reference():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from toolrl.models.tiny import shape_config
    from toolrl.trainer.memory import ModelShape, plan_memory

    config = shape_config("qwen2.5-0.5b")
    shape = ModelShape.from_hf_config(config)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    import torch

    with torch.device("meta"):
        model = get_peft_model(AutoModelForCausalLM.from_config(config),
                               LoraConfig(r=16, target_modules=list(targets)))
    assert shape.lora_params(16, targets) == sum(p.numel() for p in model.parameters()
                                                 if p.requires_grad)
    scale = "configs/scale_0p5b_cpu.yaml"
    kl = ["actor.loss.kl_loss_coef=0.01"]
    full = plan_memory(load_config(scale, kl), shape)
    lora = plan_memory(load_config(scale, [*kl, "actor.lora.rank=16"]), shape)
    worker = next(p for p in full.processes if p.name.startswith("worker: actor"))
    lworker = next(p for p in lora.processes if p.name.startswith("worker: actor"))
    assert "ref weights" in worker.resident and "ref weights" not in lworker.resident
    assert lworker.resident["actor AdamW state"] == pytest.approx(
        2 * shape.lora_params(16, targets) * 4)
    assert lworker.resident["actor AdamW state"] < worker.resident["actor AdamW state"] / 50
    assert lora.host_total < full.host_total
