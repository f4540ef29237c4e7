"""Mixed environments without workers: rows of several envs, per-env reward sets and metrics,
per-row env kwargs, the config keys, and the eval summary (BFCL's averages on BFCL rows)."""

from __future__ import annotations

import json

import pytest

from toolrl.core.registration import env_class, env_of, row_env
from toolrl.core.trajectory import Trajectory, TurnRecord
from toolrl.trainer.config import ConfigError, MixtureSource, load_config
from toolrl.trainer.evaluate import result_tables, summarize
from toolrl.trainer.mixture import RewardSets, mixture_rows, success_by

FC, BANK, CALC = "toolrl/FunctionCalling-v0", "toolrl/Bank-v0", "toolrl/Calculator-v0"


def test_mixture_rows_stamp_their_env_unless_a_row_names_one(tmp_path):
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps({"id": "x", "env": CALC, "question": "q"}) + "\n"
                   + json.dumps({"id": "y", "question": "q"}) + "\n")
    sources = [MixtureSource(env=BANK, train_size=3, val_size=2),
               MixtureSource(env=CALC, env_kwargs={"max_turns": 2}, train_size=2, val_size=1,
                             task_kwargs={"difficulty": 2}),
               MixtureSource(env=FC, train_file=str(own), val_file=str(own))]
    train, val = mixture_rows(sources, seed=0, env_class=env_class)
    assert [r["env"] for r in train] == [BANK] * 3 + [CALC] * 2 + [CALC, FC]
    assert [r["env"] for r in val] == [BANK] * 2 + [CALC] + [CALC, FC]
    assert all(r["difficulty"] == 2 and r["env_kwargs"] == {"max_turns": 2}
               for r in train[3:5])
    assert "env_kwargs" not in train[0] and "env_kwargs" not in train[5]  # kept its own env
    assert env_of(train[0], FC) == BANK and env_of({"id": "z"}, FC) == FC
    again, _ = mixture_rows(sources, seed=0, env_class=env_class)
    assert again == train  # seeded


def test_row_env_applies_the_config_kwargs_to_their_own_env_only():
    assert row_env({}, CALC, {"difficulty": 2}) == (CALC, {"difficulty": 2})
    assert row_env({"env": CALC, "env_kwargs": {"style": "plain"}}, CALC, {"difficulty": 2}) \
        == (CALC, {"difficulty": 2, "style": "plain"})
    assert row_env({"env": BANK}, CALC, {"difficulty": 2}) == (BANK, {})
    assert row_env({"env": BANK, "env_kwargs": {"max_turns": 3}}, CALC, {}) == \
        (BANK, {"max_turns": 3})
    with pytest.raises(ValueError, match="no 'env' field"):
        row_env({}, None, {})
    with pytest.raises(ValueError, match="env_kwargs must be an object"):
        row_env({"env": BANK, "env_kwargs": [1]}, CALC, {})


def traj(env_row, success, text="7"):
    return Trajectory(turns=[TurnRecord(action=text)], row=env_row, success=success,
                      info={"success": success}, sampled_tokens=len(text))


def test_reward_sets_score_each_env_with_its_own_set():
    sets = RewardSets({"rewards": [{"name": "success"}]},
                      {BANK: {"rewards": [{"name": "success", "weight": 2.0},
                                          {"name": "length_penalty",
                                           "kwargs": {"max_tokens": 1}}]}})
    try:
        trajs = [traj({"id": "a"}, True), traj({"id": "b", "env": BANK}, True),
                 traj({"id": "c"}, False), traj({"id": "d", "env": BANK}, False)]
        results, metrics = sets.score(trajs, [FC, BANK, CALC, BANK])
    finally:
        sets.close()
    assert results[0].score == 1.0 and results[2].score == 0.0
    assert results[1].score == pytest.approx(2.0 + results[1].components["length_penalty"])
    assert metrics["reward/success"] == 0.5  # the default set's rows (FC, Calculator)
    assert metrics[f"reward/{BANK}/success"] == 0.5
    assert f"reward/{BANK}/length_penalty" in metrics and "reward/length_penalty" not in metrics
    assert metrics["reward/total"] == pytest.approx(sum(r.score for r in results) / 4)


def test_success_by_and_config_keys(tmp_path):
    trajs = [traj({}, s) for s in (True, False, True, True)]
    assert success_by("val/success", trajs, [FC, FC, BANK, CALC]) == {
        f"val/success/{FC}": 0.5, f"val/success/{BANK}": 1.0, f"val/success/{CALC}": 1.0}
    cfg = load_config("configs/function_calling_mixed.yaml")
    assert [s.env for s in cfg.data.mixture] == [BANK, CALC]
    assert set(cfg.env_rewards) == {FC, BANK} and cfg.rollout.max_prompt_tokens == 640
    bad = {"data.mixture=[{train_size: 2}]": "data.mixture\\[0\\].env is required",
           "data.mixture=[{env: x, tran_size: 2}]": "Valid keys of MixtureSource",
           "env_rewards={x: {rewardz: []}}": "unknown config key 'env_rewards.x.rewardz'",
           "rollout.max_prompt_tokens=1152": "leave room for the response"}
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            load_config("configs/function_calling_mixed.yaml", [override])


def test_summarize_reports_categories_envs_and_bfcl_averages():
    rows = ([{"category": "simple_python", "source": "bfcl"}] * 4
            + [{"category": "live_simple", "source": "bfcl"}] * 2
            + [{"category": "simple"}] * 2  # toolrl's own category: not a BFCL row
            + [{"category": "d1", "env": CALC}] * 2)
    wins = [True, True, True, False, True, False, True, True, False, True]
    trajs = [traj(row, w) for row, w in zip(rows, wins, strict=True)]
    results = summarize(trajs, [float(w) for w in wins], FC)
    assert results["num_tasks"] == 10 and results["success"] == 0.7
    assert results["per_category"]["simple_python"] == {"n": 4, "success": 0.75,
                                                        "reward_mean": 0.75, "infra_failed": 0}
    assert results["infra_failed"] == 0 and results["infra_failed_by_kind"] == {}
    assert results["per_env"][CALC]["success"] == 0.5 and results["per_env"][FC]["n"] == 8
    bfcl = results["bfcl"]
    assert bfcl["per_category"] == {"live_simple": {"correct": 1, "n": 2, "accuracy": 0.5},
                                    "simple_python": {"correct": 3, "n": 4, "accuracy": 0.75}}
    assert bfcl["non_live"]["Python Simple AST"] == 0.75
    assert bfcl["live"]["Python Simple AST"] == 0.5 and bfcl["live"]["AST Summary"] == "N/A"
    assert "simple" not in bfcl["missing"] and "multiple" in bfcl["missing"]
    titles = [t.title for t in result_tables(results)]
    assert titles[:3] == ["eval by category", "eval by env", "BFCL categories"]
    assert "BFCL live" in titles
    single = summarize(trajs[6:8], [1.0, 1.0], FC)
    assert "per_env" not in single and "bfcl" not in single
