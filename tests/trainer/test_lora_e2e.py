"""A LoRA actor end to end on the real stack: the reference is the actor with its adapter
off, the adapter is pushed into vLLM's LoRA support, the canary checks every push, and the run
ends with the adapter and the merged model."""

from __future__ import annotations

import json

import pytest
from trainer_runs import run_training_in_process, small_run_overrides

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_lora_adapter_run_with_a_kl_term(ray_cluster, tiny_model_dir, tmp_path):
    run = tmp_path / "lora"
    rows = run_training_in_process(small_run_overrides(tiny_model_dir, run, **{
        "trainer.total_steps": 2, "actor.lora.rank": 8, "actor.lora.sync": "adapter",
        "actor.lr": 1e-2, "actor.loss.kl_loss_coef": 0.1}))
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows[1:]:
        assert row["policy_version"] == row["step"]
        assert row["sync/probe_max_abs_diff"] < 1e-3  # the engine serves the pushed adapter
        assert row["actor/kl_ref"] >= 0  # reference log-probs came from the adapter-off actor
    assert rows[2]["actor/kl_ref"] > 0  # the adapter moved the policy away from the base
    adapter = json.loads((run / "final_adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and adapter["peft_type"] == "LORA"
    assert (run / "final_hf" / "model.safetensors").exists()
