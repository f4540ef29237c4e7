"""A run over three envs on the real stack (Ray, vLLM CPU engine, FSDP2 on gloo, tiny model):
per-env metrics and reward sets; then `toolrl eval` on BFCL rows writes BFCL's table."""

from __future__ import annotations

import json

import pytest
from trainer_runs import run_training_in_process, small_run_overrides

from toolrl.cli import main
from toolrl.core.trajectory import Trajectory
from toolrl.data.bfcl import load_bfcl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FC, BANK, CALC = "toolrl/FunctionCalling-v0", "toolrl/Bank-v0", "toolrl/Calculator-v0"
ENVS = {FC, BANK, CALC}
MIXTURE = (f"[{{env: {BANK}, train_size: 6, val_size: 2}}, "
           f"{{env: {CALC}, train_size: 6, val_size: 2, task_kwargs: {{difficulty: 1}}}}]")


def bfcl_rows(tmp_path):
    """A few BFCL v4 entries in BFCL's layout, loaded as rows."""
    fn = {"name": "get_user_info", "description": "Details of a user.",
          "parameters": {"type": "dict", "properties": {"user_id": {"type": "integer"}},
                         "required": ["user_id"]}}
    (tmp_path / "possible_answer").mkdir()
    rows = []
    for category, n in (("simple_python", 2), ("live_simple", 2), ("irrelevance", 1)):
        name = f"BFCL_v4_{category}.json"
        ids = [f"{category}_{i}" if "live" not in category else f"{category}_{i}-0-0"
               for i in range(n)]
        (tmp_path / name).write_text("".join(json.dumps({
            "id": i, "question": [[{"role": "user", "content": f"Details of user {k}?"}]],
            "function": [fn]}) + "\n" for k, i in enumerate(ids)))
        if category != "irrelevance":
            (tmp_path / "possible_answer" / name).write_text("".join(json.dumps({
                "id": i, "ground_truth": [{"get_user_info": {"user_id": [k]}}]}) + "\n"
                for k, i in enumerate(ids)))
        rows += load_bfcl(tmp_path / name)
    return rows


def test_mixed_run_logs_per_env_metrics_and_eval_writes_bfcl_table(
        ray_cluster, tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    overrides = small_run_overrides(tiny_model_dir, run, **{
        "trainer.total_steps": 2, "data.train_size": 6, "data.val_size": 2,
        "data.batch_size": 6, "algorithm.group_size": 2, "data.mixture": MIXTURE,
        "rollout.max_total_tokens": 768, "rollout.max_prompt_tokens": 640,
        "rollout.engine.max_model_len": 768})
    rows = run_training_in_process(overrides, config="configs/function_calling_mixed.yaml")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in (rows[0], rows[-1]):  # validation before RL and at the end, per env
        assert {k.removeprefix("val/success/") for k in row
                if k.startswith("val/success/toolrl/")} == ENVS
        # the configured rewards (each env's set) apart from success and the env's own reward
        assert "val/reward_mean" in row and "val/env_reward_mean" in row
        assert f"val/reward/{FC}/toolcall_fine" in row and "val/reward/success" in row
    trained = {k.removeprefix("train/success/") for r in rows[1:] for k in r
               if k.startswith("train/success/toolrl/")}
    assert trained == ENVS  # 18 rows, 6 per step: every env was drawn
    for r in rows[1:]:
        per_env = [v for k, v in r.items() if k.startswith("train/success/toolrl/")]
        assert all(0.0 <= v <= 1.0 for v in per_env) and per_env
    keys = {k for r in rows[1:] for k in r}
    # each env's own reward set, the default set for Calculator (test_digit_fraction+success)
    assert f"reward/{FC}/toolcall_fine" in keys and f"reward/{FC}/toolcall_fine/format" in keys
    assert f"reward/{BANK}/exec_state" in keys and f"reward/{BANK}/success" in keys
    assert "reward/test_digit_fraction" in keys and "reward/toolcall_fine" not in keys
    dumped = [json.loads(line) for line in (run / "rollouts" / "step_2.jsonl").read_text()
              .splitlines()]
    assert dumped  # each line: the episode's Trajectory and the reward it got
    trajs = [Trajectory.from_dict({k: v for k, v in d.items() if k != "reward"}) for d in dumped]
    assert all(t.row.get("id") and t.turns for t in trajs)
    assert len({t.policy_version for t in trajs}) == 1  # one batch, one version of weights

    val = tmp_path / "bfcl_val.jsonl"
    val.write_text("".join(json.dumps(r) + "\n" for r in bfcl_rows(tmp_path)))
    out = tmp_path / "eval"
    eval_overrides = [o for o in overrides if not o.startswith("model.path=")]
    assert main(["eval", "--config", "configs/function_calling_mixed.yaml", "--model",
                 str(run / "final_hf"), "--output-dir", str(out), *eval_overrides,
                 f"data.val_file={val}", "rollout.concurrency=1", "--save-transcripts"]) == 0
    # one episode at a time: chunks of 8 episodes, a progress line after each
    printed = capsys.readouterr().out
    progress = [line for line in printed.splitlines() if "eval: " in line
                and "episodes, success so far" in line]
    assert [line.split("eval: ")[1].split(" ")[0] for line in progress] == ["8/9", "9/9"]
    # the transcripts are trajectories with their rewards: `toolrl score` with the config's
    # reward sets gives every one the reward the eval gave it
    saved = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert len(saved) == 9 and all(Trajectory.from_dict({k: v for k, v in d.items()
                                                         if k != "reward"}).turns for d in saved)
    scored = tmp_path / "scored.jsonl"
    assert main(["score", str(out / "transcripts.jsonl"), "--config",
                 "configs/function_calling_mixed.yaml", "--output", str(scored)]) == 0
    for line in scored.read_text().splitlines():
        line = json.loads(line)
        assert line["score"] == pytest.approx(line["saved_reward"], abs=1e-6)
    results = json.loads((out / "results.json").read_text())
    assert results["num_tasks"] == 5 + 2 + 2
    # the compute account: every saved episode's tokens, over the evaluation's wall time
    assert results["perf"]["tokens"] == sum(d["prompt_tokens"] + d["response_tokens"]
                                            for d in saved)
    assert results["perf"]["seconds"] > 0 and results["perf"]["flop_per_s"] > 0
    assert set(results["per_env"]) == ENVS and results["per_env"][FC]["n"] == 5
    assert set(results["per_category"]) >= {"simple_python", "live_simple", "irrelevance"}
    bfcl = results["bfcl"]
    assert {c: v["n"] for c, v in bfcl["per_category"].items()} == {
        "simple_python": 2, "live_simple": 2, "irrelevance": 1}
    for c, v in bfcl["per_category"].items():
        assert v["accuracy"] == results["per_category"][c]["success"]
    assert bfcl["non_live"]["Python Simple AST"] == bfcl["per_category"]["simple_python"][
        "accuracy"]
    assert bfcl["non_live"]["AST Summary"] == "N/A" and "multiple" in bfcl["missing"]
    assert 0.0 <= bfcl["overall"]["Overall Acc"] <= 0.3  # only 30% of BFCL's weight evaluated
    assert "BFCL categories" in printed and "Non-Live Overall Acc" in printed
    assert "eval: " in printed and "by env" in printed
