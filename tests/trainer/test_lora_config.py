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
