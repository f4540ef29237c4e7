"""Fast checks of the benchmark scripts without running them (and without installing peers):
argument parsing and plans (--dry-run), the step-alternation protocol, the bench env, the
reports built from fake results, and `make bench`'s RESULTS.md assembly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_lora  # noqa: E402
import bench_scale  # noqa: E402
import bench_scaling  # noqa: E402
import bench_trl  # noqa: E402
import bench_weight_sync  # noqa: E402
import benchlib  # noqa: E402
import run_all  # noqa: E402

SCRIPTS = ["bench_trl.py", "bench_weight_sync.py", "bench_env_overhead.py", "bench_scaling.py",
           "bench_scale.py", "bench_update.py", "bench_mcp.py", "bench_lora.py",
           "bench_gateway.py", "bench_canary.py", "bench_bfcl_multi_turn.py", "bench_bfcl_ast.py",
           "bench_mismatch.py", "bench_async_real.py",
           "run_all.py"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_dry_run_parses_arguments_and_starts_nothing(script, tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / script), "--dry-run", "--quick"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    bad = subprocess.run([sys.executable, str(BENCH / script), "--no-such-flag"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unrecognized arguments" in bad.stderr


def test_run_all_dry_run_lists_every_benchmark_with_quick():
    out = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--dry-run", "--quick"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    for bench in run_all.BENCHES:
        assert bench.script in out
        assert (BENCH / bench.script).exists()
    assert out.count("--quick") == len(run_all.available())


def test_run_all_rejects_unknown_names():
    out = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--only", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown benchmark" in out.stderr


def test_trl_quick_shrinks_the_work_and_both_sides_get_the_same_budget():
    args = bench_trl.parse_args(["--quick"])
    assert (args.steps, args.batch_size, args.group_size) == (2, 4, 4)
    spec = bench_trl.make_spec(args, "m", "t.jsonl", "o")
    over = dict(o.split("=", 1) for o in bench_trl.toolrl_overrides(spec))
    assert over["data.batch_size"] == str(spec["batch_size"])
    assert over["algorithm.group_size"] == str(spec["group_size"])
    assert over["rollout.max_turns"] == str(spec["max_turns"])
    # the response budget is TRL's max_completion_length on both sides
    assert over["rollout.max_tokens_per_turn"] == str(spec["max_completion_length"])
    assert int(over["rollout.max_total_tokens"]) == 2 * spec["max_completion_length"]
    assert over["trainer.total_steps"] == str(spec["steps"]) == str(args.steps + 1)


def _fake_trl_raw(toolrl_step: float, trl_step: float) -> dict:
    def steps(step_s: float, tokens: float) -> list[dict]:
        return [{"step_s": step_s * (1 + 0.1 * i), "rollout_s": step_s / 2,
                 "update_s": step_s / 2, "sampled_tokens": tokens, "tool_calls_mean": 2.0,
                 "reward_mean": 0.25, "phases": {"rollout": step_s / 2, "update": step_s / 4}}
                for i in range(4)]

    ready = {"versions": {}, "prompt_tokens": 159, "torch_threads": 2}
    return {"machine": "test machine", "model": "models/x", "warm_start_s": 1.0,
            "startup_s": {"toolrl": 30.0, "trl": 5.0},
            "ready": {"toolrl": {**ready, "versions": {"toolrl": "0.1.0"}},
                      "trl": {**ready, "versions": {"trl": "1.16.0"}}},
            "steps": {"toolrl": steps(toolrl_step, 2000), "trl": steps(trl_step, 1000)}}


def test_trl_report_states_the_ratio_and_whether_the_target_is_met():
    args = bench_trl.parse_args(["--steps", "3"])
    met = bench_trl.summarize(_fake_trl_raw(1.0, 4.0), args, ["--steps", "3"])
    assert "= 0.25x** (target <= 0.5x: met)" in met
    assert "| GRPO step (s) |" in met and "bench_trl.py --steps 3" in met
    assert "rollout tok/s 8.00x" in met  # 2000 tokens in 0.5 s vs 1000 in 2 s
    lost = bench_trl.summarize(_fake_trl_raw(3.0, 2.0), args, [])
    assert "= 1.50x** (target <= 0.5x: NOT met)" in lost
    assert "use_vllm" in lost  # the vLLM variant is explained, not silently missing


def test_scaling_report_tables_and_plots(tmp_path, monkeypatch):
    monkeypatch.setattr(benchlib, "PLOTS_DIR", tmp_path / "plots")
    args = bench_scaling.parse_args(["--batch-sizes", "2", "4", "--turns", "1", "2",
                                     "--workers", "1", "2", "--default-batch", "4",
                                     "--default-turns", "1"])
    assert bench_scaling.points(args) == [(2, 1), (4, 1), (4, 2)]

    def row(step: float) -> dict:
        return {"step": step, "rollout": step / 2, "log_probs": 0.1, "update": step / 3,
                "sync": 0.05, "tokens": 100.0 * step, "turns": 1.0}

    raw = {"workers": {
        "1": {"threads": "1", "points": {"2x1": [row(1.0)], "4x1": [row(2.0)],
                                         "4x2": [row(3.0), row(5.0)]}},
        "2": {"threads": "1,1", "points": {"4x1": [row(2.5)]}}}}
    text = bench_scaling.report(raw, args, [], "test machine")
    assert "| 4 | 2 | 2.00x | 2 |" in text  # batch 4 costs twice batch 2
    assert "| 2 | 4 | 2.00x | 3 |" in text  # 2 turns: median of 3 and 5, vs 2 for 1 turn
    assert "| 2 | 2.5 | 1.25x | 2.5 |" in text  # two workers
    for name in ("batch", "turns", "workers"):
        assert (tmp_path / "plots" / f"scaling_{name}.png").stat().st_size > 1000


def test_scaling_trainer_config_passes_the_trainers_checks(tiny_model_dir, tmp_path):
    """The config every scaling trainer starts from passes `check_config` (the Turns env's
    make_tasks refused the quickstart's Calculator kwargs that an override merged into)."""
    from toolrl.trainer.preflight import check_config

    benchlib.register_bench_envs()
    args = bench_scaling.parse_args(["--quick"])
    cfg = bench_scaling.trainer_config(args, tmp_path / "run", 1, tiny_model_dir)
    check_config(cfg)
    assert cfg.env.id == benchlib.TURNS_ENV_ID
    assert cfg.data.task_kwargs == {"turns": args.default_turns}


def test_weight_sync_report_and_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(benchlib, "PLOTS_DIR", tmp_path)
    results = [{"size": size, "params": mib * 2.6e5, "mib": mib, "push_s": push,
                "gather_s": push / 10, "engine_start_s": 30.0}
               for size, mib, push in (("small", 5.0, 0.1), ("large", 50.0, 0.4))]
    text = bench_weight_sync.report(results, "test machine", [], reps=3)
    assert "| small | 1.30M | 5.0 | 100 | 10 | 90 | 50 | 30 | 300x |" in text
    assert "grow 10.0x and the push time 4.0x" in text
    assert "**Weight push into the engine: small (5 MiB) 100 ms; large (50 MiB) 400 ms; " \
           "restarting the engine instead would cost at least 75x more.**" in text
    assert bench_weight_sync.plot(results).stat().st_size > 1000


def test_bench_env_plays_exactly_the_rows_turns():
    import toolrl

    env_cls = benchlib.register_bench_envs()
    assert benchlib.register_bench_envs() is env_cls  # idempotent (a Ray setup hook)
    env = toolrl.make_env(benchlib.TURNS_ENV_ID)
    try:
        env.reset(seed=0, options=env_cls.make_tasks(1, turns=3)[0])
        ends = [env.step("any text at all")[2] for _ in range(3)]
    finally:
        env.close()
    assert ends == [False, False, True]


def test_channel_alternates_with_a_worker_process(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(
        f"import sys; sys.path.insert(0, {str(BENCH)!r})\n"
        "import benchlib\n"
        "send, receive = benchlib.worker_channel()\n"
        "print('library noise goes to stderr')\n"
        "send({'event': 'ready'})\n"
        "n = 0\n"
        "while receive().get('cmd') == 'step':\n"
        "    n += 1\n"
        "    send({'event': 'step', 'n': n})\n")
    channel = benchlib.Channel("echo", [sys.executable, str(worker)], tmp_path / "w.log")
    try:
        assert channel.receive(timeout=30) == {"event": "ready"}
        for n in (1, 2):
            channel.send({"cmd": "step"})
            assert channel.receive(timeout=30) == {"event": "step", "n": n}
    finally:
        channel.close(timeout=30)
    assert channel.proc.returncode == 0
    assert "library noise" in (tmp_path / "w.log").read_text()


def test_channel_reports_a_dead_worker_with_its_log(tmp_path):
    channel = benchlib.Channel("dies", [sys.executable, "-c",
                                        "import sys; print('boom', file=sys.stderr); sys.exit(3)"],
                               tmp_path / "d.log")
    with pytest.raises(RuntimeError, match=r"dies exited \(3\)[\s\S]*boom"):
        channel.receive(timeout=30)
    channel.close(timeout=10)


def test_results_md_assembly_from_fake_result_files(tmp_path, monkeypatch):
    results, plots = tmp_path / "results", tmp_path / "plots"
    results.mkdir()
    plots.mkdir()
    monkeypatch.setattr(benchlib, "RESULTS_DIR", results)
    monkeypatch.setattr(benchlib, "PLOTS_DIR", plots)
    (results / "trl.md").write_text("# End-to-end\n\n| a | b |\n|---|---:|\n| x | 1 |\n\n"
                                    "**toolrl step time / TRL step time = 0.40x**\n")
    (results / "weight_sync.md").write_text("# Weight sync\n\n## detail\n\ntext\n")
    (plots / "trl_step.png").write_bytes(b"png")
    by_name = {b.name: b for b in run_all.BENCHES}
    outcomes = [run_all.Outcome(by_name["trl"], "ok", 120.0),
                run_all.Outcome(by_name["scaling"], "timeout", 600.0, "no result within 600 s")]
    text = run_all.assemble(outcomes, "test machine", 1800.0, quick=False)
    assert text.startswith("# toolrl benchmarks")
    assert "Total wall time: 30.0 min." in text
    assert "## End-to-end" in text and "### detail" in text  # headings nest one level down
    assert "- End-to-end GRPO step: toolrl vs TRL GRPOTrainer: **toolrl step time / TRL step " \
           "time = 0.40x**" in text
    assert "![trl_step](plots/trl_step.png)" in text
    assert "| Scaling: batch size, turns, rollout workers | timeout | 600 |" in text
    assert "This run: **timeout** (no result within 600 s)" in text
    assert "| Weight sync time vs model size | from an earlier run |" in text
    assert "| Controller dispatch overhead | no result |" in text
    # item 5 of the issue: labelled, not silently missing
    assert "## Sync vs one-step-off pipeline" in text
    if (BENCH / "bench_pipeline.py").exists():
        assert "No result file yet" in text
    else:
        assert "Not yet available" in text and "| not yet available |" in text


def test_pipeline_section_before_its_benchmark_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(benchlib, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(run_all, "BENCH_DIR", tmp_path)  # no bench_pipeline.py there
    text = run_all.assemble([], "test machine", None, quick=True)
    assert "| Sync vs one-step-off pipeline | not yet available |" in text
    assert "**Not yet available.**" in text
    assert "run_all.py --quick" in text


def test_markdown_table_formats_numbers():
    table = benchlib.md_table(["name", "value"], [("a", 0.012345), ("b", 1234.5),
                                                  ("c", float("nan"))])
    assert table.splitlines()[1] == "| --- | ---: |"
    assert "| a | 0.0123 |" in table and "| b | 1234 |" in table and "| c | n/a |" in table


def test_scale_report_from_fake_results():
    gib = 2**30
    run = {"label": "0p5b", "steps": 3, "seconds": 500.0, "config": ["configs/x.yaml"],
           "timing": {**{ph: [1.0, 2.0, 3.0] for ph in bench_scale.PHASES},
                      "step": [10.0, 11.0, 12.0]},
           "peaks": {"driver": [gib // 2], "Ray system processes": [gib // 4, gib // 4],
                     "worker: actor + rollout": [11 * gib], "vLLM engine core": [3 * gib]},
           "planned": {"driver": 0.6 * gib, "Ray system processes": 0.6 * gib,
                       "worker: actor + rollout": 10 * gib, "vLLM engine core": 3 * gib},
           "plan_total": 14.2 * gib, "sampled_total": 14.0 * gib,
           "plan_summary": "memory plan: host 14.2 GiB"}
    push = {"weights_bytes": 2 * gib, "largest_tensor_bytes": gib // 2, "results": [
        {"bucket_mb": 256.0, "runs": [{"seconds": 5.0, "actor_extra": gib // 2,
                                       "engine_extra": 3 * gib // 2, "buckets": 7}]}]}
    text = bench_scale.report({"train": run, "push": push}, "test machine", ["--reps", "1"])
    heads = run_all.headlines(text)
    assert len(heads) == 1 and "actor/rollout process 11.00 GiB" in heads[0]
    assert "engine core 3.00 GiB" in heads[0] and "256 MiB buckets 2.00 GiB" in heads[0]
    assert "all processes at once 14.00 GiB (plan 14.20)" in heads[0]
    assert "| **all processes at once** (sampled every 0.25 s; plan: its busiest phase) |  | " \
        "**14.00** | **14.20** | **0.99** |" in text
    assert "| sum of the peaks above |" in text and "| 256 | 7 |" in text


def test_lora_report_states_memory_and_sync_ratios():
    mib = 2 ** 20
    result = {"size": "large", "rank": 16, "params": 12_000_000,
              "memory": {"full": (12_000_000, 48 * mib, 96 * mib),
                         "lora": (600_000, 2.4 * mib, 4.8 * mib)},
              "update_s": {"full": 1.0, "lora": 0.8},
              "sync_s": {"full": 0.2, "merge": 0.25, "adapter": 0.05},
              "probe_max_abs_diff": {"merge": 2e-6, "adapter": 3e-6}, "reps": 3, "rows": 16}
    shape = {**result, "size": "qwen2.5-0.5b", "params": 494_000_000, "reps": 2, "rows": 8,
             "memory": {"full": (494_000_000, 1885 * mib, 3770 * mib),
                        "lora": (8_800_000, 33.6 * mib, 67.2 * mib)},
             "sync_s": {"full": 4.0, "merge": 4.0, "adapter": 0.2},
             "peaks_gib": {"full actor: update": 10.9}}
    text = bench_lora.report([result, shape], "a machine", ["--reps", "3"])
    heads = run_all.headlines(text)
    assert len(heads) == 2
    assert "5.0% of the parameters" in heads[0] and "(20x less)" in heads[0]
    assert "merged push 1.25x, adapter push 0.25x the full-weights push" in heads[0]
    assert "the qwen2.5-0.5b shape" in heads[1] and "(56x less)" in heads[1]
    assert "merged push 1.00x, adapter push 0.05x" in heads[1]
    assert "| LoRA rank 16, sync=adapter |" in text and "| full actor: update | 10.90 |" in text


def test_canary_report_from_fake_rows():
    """bench_canary's table: ranges per lr and kind of push, and the reading says which missed
    pushes the bf16 bound catches."""
    import bench_canary

    def row(lr, step, push, mean):
        return {"lr": lr, "step": step, "push": push, "max": 4 * mean, "mean": mean,
                "p90": 2 * mean, "n": 64}

    rows = [row(1e-6, 0, "correct", 0.03), row(1e-6, 1, "missed (1 step old)", 0.04),
            row(1e-6, 1, "correct", 0.05), row(1e-6, 1, "missed (1 steps old)", 0.045),
            row(1e-4, 0, "correct", 0.04), row(1e-4, 1, "missed (1 step old)", 0.3),
            row(1e-4, 1, "correct", 0.04), row(1e-4, 1, "missed (1 steps old)", 0.3)]
    text = bench_canary.render(rows, [1e-6, 1e-4], "m", "cmd", "machine")
    assert "| 1e-06 | correct, 2 pushes | 0.1200 .. 0.2000 | 0.0300 .. 0.0500 |" in text
    assert "lr 1e-06: 0.0400 .. 0.0450 (1 step / 1 steps behind; inside the band" in text
    assert "lr 0.0001: 0.3000 (1 step / 1 steps behind; past it)" in text
    assert "past the bound in this run: missed (1 step old) at lr 0.0001" in text
    assert text.splitlines()[4].startswith("**bf16 canary")


def test_mismatch_report_from_fake_rows():
    """bench_mismatch's table: per dtype and sample kind, the |Δ log p| distribution and the
    share of tokens each correction capped or masked."""
    import bench_mismatch

    args = bench_mismatch.parse(["--quick"])
    row = {"dtype": "bfloat16", "what": "Calculator episodes", "samples": 4.0, "tokens": 200.0,
           "log_prob_diff_abs_mean": 0.012, "log_prob_diff_abs_p50": 0.008,
           "log_prob_diff_abs_p99": 0.09, "log_prob_diff_abs_max": 0.31, "ratio_p1": 0.91,
           "ratio_p99": 1.1, **{label: 0.005 for label, _ in bench_mismatch.CORRECTIONS}}
    text = bench_mismatch.render([row], args, "cmd", "machine")
    assert "| bfloat16, Calculator episodes | 4 | 200 | 0.012 | 0.008 | 0.09 | 0.31 | 0.91 | " \
        "1.1 | 0.50% | 0.50% | 0.50% | 0.50% |" in text
    assert "`cmd`" in text and "Machine: machine." in text


def test_async_real_report_states_the_ratio_and_the_held_out_change():
    """bench_async_real's table and verdicts: async's step time as a ratio of sync's and its
    held-out change in points, against the issue's targets."""
    import bench_async_real

    def run(mode, k, step_s, after):
        steps = [{"step": 0, "val/success": 0.25}]
        steps += [{"step": i, "timing/step_s": step_s * (3 if i == 1 else 1),
                   "actor/tis_capped": 0.01, "correction/ratio_p99": 1.2,
                   **({"async/token_staleness_mean": 0.5} if k else {})} for i in (1, 2, 3)]
        steps[-1]["val/success"] = after
        return {"mode": mode, "staleness": k, "steps": steps}

    args = bench_async_real.parse(["--steps", "3"])
    raw = {"runs": [run("sync", None, 10.0, 0.40), run("async", 1, 7.0, 0.39),
                    run("async", 2, 8.0, 0.30)]}
    text = bench_async_real.render(raw, args, "cmd", "machine")
    assert "| async (max_staleness 1) | 7.0 | 0.70x | 0.250 | 0.390 | -1.0 |" in text
    assert "async (max_staleness 1): step time 0.70x sync's (target <= 0.75x: met); " \
        "held-out -1.0 points against sync's (target >= -2: met)." in text
    assert "async (max_staleness 2): step time 0.80x sync's (target <= 0.75x: not met); " \
        "held-out -10.0 points against sync's (target >= -2: not met)." in text
