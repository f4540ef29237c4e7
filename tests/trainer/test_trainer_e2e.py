"""End-to-end runs of the trainer on the real stack (Ray, vLLM CPU engine, FSDP2 on gloo)."""

from __future__ import annotations

import json

import pytest
from trainer_runs import run_training_in_process, small_run_overrides

from toolrl.trainer.compute import model_shape

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_ppo_config_runs_three_steps(ray_cluster, tiny_model_dir, tmp_path):
    rows = run_training_in_process(
        small_run_overrides(tiny_model_dir, tmp_path / "ppo", **{
            "trainer.total_steps": 3, "trainer.log_rollouts": 8}),  # every episode of a step
        config="configs/ppo_calculator.yaml")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    run = tmp_path / "ppo"
    shape = model_shape(tiny_model_dir)
    for row in rows[1:]:
        assert any(k.startswith("critic/") for k in row), sorted(row)
        assert row["timing/step_s"] > 0 and "train/success" in row
        assert row["policy_version"] == row["step"]
        # the compute account: the tokens of the step's 8 episodes (a group's shared prompt
        # once), twice (2 PPO epochs) for the actor and twice for the critic (the same body)
        episodes = [json.loads(line) for line in
                    (run / "rollouts" / f"step_{row['step']}.jsonl").read_text().splitlines()]
        prompts = {e["uid"]: e["prompt_tokens"] for e in episodes}
        tokens = sum(prompts.values()) + sum(e["response_tokens"] for e in episodes)
        assert len(prompts) == 2  # two tasks, a group of 4 each
        assert len(episodes) == 8 and row["perf/update_tokens"] == 4 * tokens
        assert row["perf/log_prob_tokens"] == 2 * tokens  # old log-probs and the values
        assert row["perf/rollout_tokens"] == tokens and row["perf/rollout_flop_per_s"] > 0
        assert row["perf/update_flop_per_s"] == pytest.approx(
            3 * row["perf/flop_per_token"] * 4 * tokens / row["timing/update_s"])
        assert 2 * shape.params < row["perf/flop_per_token"] < 2.5 * shape.params
    assert "val/success" in rows[0] and "val/success" in rows[-1]
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
