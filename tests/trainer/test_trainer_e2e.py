"""End-to-end runs of the trainer on the real stack (Ray, vLLM CPU engine, FSDP2 on gloo)."""

from __future__ import annotations

import pytest
from trainer_runs import run_training_in_process, small_run_overrides

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_ppo_config_runs_three_steps(ray_cluster, tiny_model_dir, tmp_path):
    rows = run_training_in_process(
        small_run_overrides(tiny_model_dir, tmp_path / "ppo", **{"trainer.total_steps": 3}),
        config="configs/ppo_calculator.yaml")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for row in rows[1:]:
        assert any(k.startswith("critic/") for k in row), sorted(row)
        assert row["timing/step_s"] > 0 and "train/success" in row
        assert row["policy_version"] == row["step"]
    assert "val/success" in rows[0] and "val/success" in rows[-1]
    run = tmp_path / "ppo"
    for name in ("config.yaml", "rollouts/step_3.jsonl", "plots/reward.png",
                 "final_hf/config.json"):
        assert (run / name).exists(), name
    assert list((run / "tensorboard").iterdir())


def test_filter_groups_trains_only_on_groups_whose_rewards_differ(ray_cluster, tiny_model_dir,
                                                                 tmp_path):
    """Every sample of an even-numbered task gets the same reward: with algorithm.filter_groups
    those groups leave the update (DAPO's filter), the others train; the share is logged."""
    rows = run_training_in_process(small_run_overrides(
        tiny_model_dir, tmp_path / "filter", **{
            "trainer.total_steps": 4, "data.batch_size": 4, "algorithm.filter_groups": True,
            "reward": "{rewards: [{name: test_even_tasks_flat}]}"}))
    seen = set()
    for row in rows[1:]:
        uniform = row["train/uniform_groups"]
        assert 0 <= uniform <= 1
        informative = round(4 * (1 - uniform))
        if uniform > 0:
            assert row["train/update_samples"] == 4 * informative  # group size 4
        assert ("actor/pg_loss" in row) == (informative > 0)
        seen.add(informative)
    assert len(seen) > 1 or seen & {1, 2, 3}, seen  # some steps filtered part of the batch
