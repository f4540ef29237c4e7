"""bench_trl's real_fc workload without training: the TRL side's re-stated score equals toolrl's
reward (configs/real_fc.yaml's bfcl_ast + 0.1 format) on many completions, the prepared rows
give TRL exactly toolrl's prompt tokens, both sides get the same budgets, and the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

import bench_trl  # noqa: E402
import trl_grpo_worker  # noqa: E402  (the TRL worker; trl itself is imported only to train)


def _completions(env, info) -> dict[str, str]:
    """Completions of every kind for the episode just reset: right, wrong, malformed, prose."""
    tools = [t["function"]["name"] for t in info["tools"]]
    gold = env.unwrapped.oracle_action()
    first = tools[0]
    return {
        "gold": gold,
        "gold, text around": "Sure, here you go.\n" + gold + "\nDone.",
        "prose": "None of these functions can help with that.",
        "empty": "",
        "wrong values": f'<tool_call>{{"name": "{first}", "arguments": {{"city": "Nowhere", '
                        f'"amount": -1, "text": "x"}}}}</tool_call>',
        "no arguments": f'<tool_call>{{"name": "{first}", "arguments": {{}}}}</tool_call>',
        "unknown tool": '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
        "malformed": f'<tool_call>{{"name": "{first}", "arguments": {{"a": </tool_call>',
        "truncated": f'<tool_call>{{"name": "{first}", "argum',
        "gold twice": gold + "\n" + gold,
        "not an object": "<tool_call>[1, 2]</tool_call>",
    }


def test_trl_score_equals_toolrl_reward_on_every_kind_of_completion():
    from toolrl.envs.function_calling import FunctionCallingEnv

    import toolrl
    from toolrl.reward import build_reward
    from toolrl.trainer.config import load_config

    cfg = load_config(bench_trl.REAL_FC_CONFIG, [bench_trl.real_fc_reward_override()])
    weights = bench_trl.real_fc_reward_weights()
    assert weights == {"bfcl_ast": 1.0, "format": 0.1}
    rows = FunctionCallingEnv.make_tasks(10, seed=3)  # two of each of the five categories
    env = toolrl.make_env("toolrl/FunctionCalling-v0")
    reward = build_reward(cfg.reward)
    seen: set[float] = set()
    try:
        for row in rows:
            _, info = env.reset(seed=0, options=dict(row))
            task = json.loads(json.dumps(bench_trl.real_fc_task(env, info)))  # as shipped
            for kind, text in _completions(env, info).items():
                want = bench_trl.toolrl_real_fc_score(env, row, text, reward, seed=0)
                got = trl_grpo_worker.real_fc_score(text, task, weights)[0]
                assert got == pytest.approx(want, abs=1e-12), (row["category"], kind, text)
                seen.add(round(want, 6))
    finally:
        reward.close()
        env.close()
    assert {0.0, 0.1, 1.1} <= seen  # wrong, well-formed but wrong, right: all three happen


def test_prepared_rows_give_trl_toolrl_prompt_ids_and_scores(tmp_path, smollm2_dir):
    from toolrl.envs.function_calling import FunctionCallingEnv
    from transformers import AutoTokenizer

    rows = FunctionCallingEnv.make_tasks(12, seed=0)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = bench_trl.parse_args(["--workload", "real_fc", "--quick", "--model", str(smollm2_dir),
                                 "--rows", str(tmp_path / "rows.jsonl")])
    prep = bench_trl.prepare_real_fc(args, smollm2_dir, tmp_path)
    need = args.batch_size * (args.steps + 1)
    assert prep["rows"] == need and prep["gold_score_min"] == pytest.approx(1.1)
    toolrl_rows = [json.loads(x) for x in Path(prep["toolrl_file"]).read_text().splitlines()]
    assert [r["id"] for r in toolrl_rows] == [r["id"] for r in rows[:need]]  # same order
    prepared = trl_grpo_worker.read_jsonl(prep["trl_file"])
    assert [r["id"] for r in prepared] == [r["id"] for r in toolrl_rows]
    # what the TRL worker checks before training, with TRL's tokenization of a text prompt
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    weights = bench_trl.real_fc_reward_weights()
    checked = trl_grpo_worker.check_real_fc_rows(prepared, tokenizer, weights)
    assert checked["rows"] == need and checked["references"] == 2 * need
    prepared[0]["prompt"] += " "
    with pytest.raises(ValueError, match="prompt ids differ"):
        trl_grpo_worker.check_real_fc_rows(prepared, tokenizer, weights)


def test_real_fc_budgets_are_the_same_on_both_sides():
    from toolrl.trainer.config import load_config

    args = bench_trl.parse_args(["--workload", "real_fc"])
    assert (args.steps, args.batch_size, args.group_size, args.response_budget, args.lr,
            args.micro_batch_size, args.max_turns) == (2, 8, 8, 160, 2e-6, 4, 1)
    recipe = load_config(bench_trl.REAL_FC_CONFIG)  # the recipe's work per step, by default
    assert (args.batch_size, args.group_size) == (recipe.data.batch_size,
                                                  recipe.algorithm.group_size)
    assert args.output == bench_trl.REAL_FC_RESULTS
    assert bench_trl.parse_args([]).output == bench_trl.RESULTS  # the calculator's, untouched
    spec = bench_trl.make_spec(args, "m", "rows.jsonl", "o")
    over = dict(o.split("=", 1) for o in bench_trl.toolrl_overrides(spec))
    assert over["data.batch_size"] == str(spec["batch_size"])
    assert over["algorithm.group_size"] == str(spec["group_size"])
    assert over["actor.micro_batch_size"] == str(spec["micro_batch_size"])
    assert over["actor.lr_schedule"] == "constant" and over["data.shuffle"] == "False"
    cfg = load_config(bench_trl.toolrl_config(spec), bench_trl.toolrl_overrides(spec))
    assert cfg.rollout.max_tokens_per_turn == spec["max_completion_length"]
    assert cfg.rollout.max_response_len == spec["max_completion_length"]
    assert cfg.trainer.total_steps == spec["steps"] == args.steps + 1
    assert cfg.actor.lr == spec["lr"] and not cfg.warm_start.enabled
    with pytest.raises(SystemExit):
        bench_trl.parse_args(["--workload", "real_fc", "--micro-batch-size", "5"])


def _fake_raw(toolrl_step: float, trl_step: float) -> dict:
    def steps(step_s: float) -> list[dict]:
        return [{"step_s": step_s, "rollout_s": step_s / 4, "update_s": 3 * step_s / 4,
                 "sampled_tokens": 800.0, "tool_calls_mean": 1.5, "success_mean": 0.25,
                 "reward_mean": 0.35, "phases": {"rollout": step_s / 4, "update": step_s / 2}}
                for _ in range(3)]

    ready = {"prompt_tokens": 600.0, "torch_threads": 2}
    return {"machine": "test machine", "model": "outputs/real_fc/warm_start",
            "startup_s": {"toolrl": 60.0, "trl": 10.0},
            "rows": {"file": "data/real_fc/nestful_train.jsonl", "rows": 12,
                     "skipped_over_budget": 1, "prompt_budget": 1536, "prompt_tokens_min": 355,
                     "prompt_tokens_median": 600.0, "prompt_tokens_max": 803,
                     "categories": ["multiple", "parallel_multiple"], "gold_score_min": 1.1},
            "ready": {"toolrl": {**ready, "versions": {"toolrl": "0.1.0"}},
                      "trl": {**ready, "versions": {"trl": "1.16.0"}}},
            "steps": {"toolrl": steps(toolrl_step), "trl": steps(trl_step)}}


def test_real_fc_report_states_the_ratio_and_the_work():
    import run_all

    argv = ["--workload", "real_fc", "--steps", "2"]
    args = bench_trl.parse_args(argv)
    text = bench_trl.summarize(_fake_raw(20.0, 80.0), args, argv)
    heads = run_all.headlines(text)
    assert heads == ["**SmolLM2-135M function calling: toolrl step time / TRL step time = "
                     "0.25x** (target <= 0.5x: met); rollout 0.25x, rest of the step 0.25x, "
                     "rollout tok/s 4.00x."]
    assert "bench_trl.py --workload real_fc --steps 2" in text
    assert "| bfcl_ast mean | 0.25 | 0.25 |" in text
    assert "the first 12 whose prompt fits" in text and "1 x `bfcl_ast` + 0.1 x `format`" in text
    lost = bench_trl.summarize(_fake_raw(90.0, 60.0), args, argv)
    assert "= 1.50x** (target <= 0.5x: NOT met)" in lost
    assert "trl_real_fc" in {b.name for b in run_all.BENCHES}


def test_a_report_rebuilt_from_raw_results_goes_where_output_says(tmp_path, monkeypatch):
    raw = {**_fake_raw(20.0, 80.0), "argv": ["--workload", "real_fc", "--steps", "2"]}
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    monkeypatch.setattr(bench_trl, "plot", lambda raw, name: tmp_path / f"{name}.png")
    out = tmp_path / "report.md"
    assert bench_trl.main(["--from-raw", str(tmp_path / "raw.json"), "--output", str(out)]) == 0
    assert "toolrl step time / TRL step time = 0.25x" in out.read_text()
