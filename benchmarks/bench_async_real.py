"""Async vs sync GRPO on the real model: SmolLM2-135M-Instruct on the real-model recipe.

configs/real_fc.yaml (function calling on BFCL's live rows, ToolRL's graded reward) from a
shortened warm start, in ``sync`` mode and in ``async`` mode at each ``--staleness`` (default
1 and 2), with the same steps, seed, data and loss in every run: the corrections of
``--corrections`` (default ``tis`` cap 2) in every mode, sync included, so only the schedule
differs. The warm start is trained once (``--warm-start-steps`` of the recipe's up to 200, its
early stop on; ``warm_start.output`` shared) and every run starts from it. Each run validates on
the first ``--val-rows`` rows of the recipe's held-out file (greedy, as training validates)
before its first step and after its last.

Per run: the median step time over steps 2 .. N (the first warms up), the held-out success
before and after, the importance ratio's distribution and what the corrections capped or masked
(means over the steps), and in async mode the staleness of the trained tokens. The report gives
async's step time as a ratio of sync's and its held-out change against sync's, measured in
one invocation on one machine; run it alone on the machine (other load moves step times).

    .venv/bin/python benchmarks/bench_async_real.py [--steps 20] [--staleness 1 2]
        [--warm-start-steps 60] [--val-rows 64] [--corrections '[{name: tis, cap: 2.0}]']
        [--quick] [--dry-run]

Needs models/smollm2-135m-instruct and data/real_fc/ (``make real-fc-data``: the model and the
data files the recipe reads). Writes benchmarks/results/async_real.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import ROOT, md_table, median

RESULTS = benchlib.RESULTS_DIR / "async_real.md"
CONFIG = ROOT / "configs" / "real_fc.yaml"
DATA = ROOT / "data" / "real_fc"
MODEL = ROOT / "models" / "smollm2-135m-instruct"
# means over the steps of each run (absent keys are skipped)
MEANS = ("correction/ratio_p1", "correction/ratio_p99", "correction/ratio_max",
         "rollout/log_prob_diff_abs_mean", "rollout/log_prob_diff_abs_p99",
         "actor/is_weight_mean", "actor/tis_capped", "actor/mis_masked", "actor/icepop_masked",
         "async/token_staleness_mean", "async/staleness_max", "train/reward_mean")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="GRPO steps per run")
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 2],
                   help="trainer.max_staleness of the async runs")
    p.add_argument("--warm-start-steps", type=int, default=60,
                   help="warm-start steps (the recipe: up to 200, early stop on)")
    p.add_argument("--val-rows", type=int, default=64, help="held-out rows validated")
    p.add_argument("--corrections", default="[{name: tis, cap: 2.0}]",
                   help="actor.loss.corrections of every run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_async_real",
                   help="run directories and the shared warm start")
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true",
                   help="2 steps, 2 warm-start steps, 4 held-out rows, small batches (a check "
                        "that it runs, not a measurement)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    p.add_argument("overrides", nargs="*", help="more key=value overrides for every run")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warm_start_steps, args.val_rows = 2, 2, 4
        args.overrides = ["data.batch_size=2", "algorithm.group_size=2",
                          "rollout.max_tokens_per_turn=48", "rollout.concurrency=4",
                          "warm_start.eval_every=0", "warm_start.val_file=null",
                          "warm_start.num_transcripts=16", *args.overrides]
    if args.steps < 2:
        p.error("--steps must be >= 2 (the first step is not timed)")
    return args


def modes(args: argparse.Namespace) -> list[tuple[str, int | None]]:
    return [("sync", None), *(("async", k) for k in args.staleness)]


def label(mode: str, k: int | None) -> str:
    return mode if k is None else f"{mode} (max_staleness {k})"


def overrides(args: argparse.Namespace, mode: str, k: int | None, val_file: Path) -> list[str]:
    """The run's overrides on configs/real_fc.yaml: only the schedule differs between runs."""
    run = args.out / (mode if k is None else f"{mode}_k{k}")
    over = [
        f"seed={args.seed}", f"trainer.total_steps={args.steps}",
        f"trainer.val_every={args.steps}", "trainer.save_every=0", "trainer.export_hf=false",
        "trainer.resume=never", f"trainer.output_dir={run}", "trainer.trackers=[jsonl]",
        f"data.val_file={val_file}", f"warm_start.steps={args.warm_start_steps}",
        f"warm_start.output={warm_start_dir(args)}",
        f"actor.loss.corrections={args.corrections}", f"trainer.mode={mode}",
    ]
    if k is not None:  # split pools: one core each
        over += [f"trainer.max_staleness={k}", "resources.cpus_per_process=1"]
    return [*over, *args.overrides]


def warm_start_dir(args: argparse.Namespace) -> Path:
    """The shared warm start, named by its budget (a run reuses only the same warm start)."""
    return args.out / f"warm_start_{args.warm_start_steps}steps{'_quick' if args.quick else ''}"


def held_out_file(args: argparse.Namespace) -> Path:
    """The first ``--val-rows`` rows of the recipe's held-out file (the same in every run)."""
    rows = (DATA / "sft_val.jsonl").read_text().splitlines()[: args.val_rows]
    path = args.out / f"val_{args.val_rows}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")
    return path


def run_one(args: argparse.Namespace, mode: str, k: int | None, val_file: Path
            ) -> dict[str, Any]:
    from toolrl.controller import init_ray, shutdown_ray
    from toolrl.trainer.config import load_config
    from toolrl.trainer.tracking import read_metrics
    from toolrl.trainer.trainer import Trainer

    cfg = load_config(CONFIG, overrides(args, mode, k, val_file))
    init_ray(num_cpus=8, runtime_env={"env_vars": {k_: os.environ[k_]
                                                   for k_ in benchlib.BENCH_ENV}})
    trainer = Trainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.close()
        shutdown_ray()
    return {"mode": mode, "staleness": k, "steps": read_metrics(cfg.run_dir / "metrics.jsonl")}


def summarize(run: dict[str, Any]) -> dict[str, float]:
    rows = run["steps"]
    train = [r for r in rows if r["step"] >= 1]
    val = [r for r in rows if "val/success" in r]
    out = {"step_s": median([r["timing/step_s"] for r in train[1:]]),
           "steps": float(len(train)),
           "val_before": val[0]["val/success"] if val else float("nan"),
           "val_after": val[-1]["val/success"] if len(val) > 1 else float("nan")}
    for key in MEANS:
        values = [r[key] for r in train if key in r]
        if values:
            out[key] = sum(values) / len(values)
    return out


def render(raw: dict[str, Any], args: argparse.Namespace, command: str, machine: str) -> str:
    sums = {label(r["mode"], r["staleness"]): summarize(r) for r in raw["runs"]}
    sync = sums.get("sync", {})

    def cell(s: dict[str, float], key: str, fmt: str = "{:.3g}") -> str:
        return fmt.format(s[key]) if key in s else "-"

    rows, verdicts = [], []
    for name, s in sums.items():
        ratio = s["step_s"] / sync["step_s"] if sync else float("nan")
        gain = 100 * (s["val_after"] - sync.get("val_after", float("nan")))
        rows.append([name, f"{s['step_s']:.1f}", f"{ratio:.2f}x",
                     f"{s['val_before']:.3f}", f"{s['val_after']:.3f}",
                     "-" if name == "sync" else f"{gain:+.1f}",
                     cell(s, "correction/ratio_p1"), cell(s, "correction/ratio_p99"),
                     cell(s, "rollout/log_prob_diff_abs_p99"),
                     *[cell(s, f"actor/{c}", "{:.2%}")
                       for c in ("tis_capped", "mis_masked", "icepop_masked")],
                     cell(s, "async/token_staleness_mean", "{:.2f}")])
        if name != "sync":
            verdicts.append(f"- {name}: step time {ratio:.2f}x sync's (target <= 0.75x: "
                            f"{'met' if ratio <= 0.75 else 'not met'}); held-out "
                            f"{gain:+.1f} points against sync's (target >= -2: "
                            f"{'met' if gain >= -2 else 'not met'}).")
    table = md_table(["run", "step (s)", "vs sync", "held-out before", "held-out after",
                      "vs sync (points)", "ratio p1", "ratio p99", "Δ log p p99",
                      "tis capped", "mis masked", "icepop masked", "token staleness"], rows)
    return "\n".join([
        "# Async vs sync GRPO on SmolLM2-135M-Instruct (the real-model recipe)", "",
        f"`{command}`", "", f"Machine: {machine}.", "",
        f"configs/real_fc.yaml from a warm start of {args.warm_start_steps} steps (the "
        f"recipe's: up to 200, early stop on), {args.steps} GRPO steps per run, seed "
        f"{args.seed}, `actor.loss.corrections={args.corrections}` in every run; held-out: "
        f"greedy success on the first {args.val_rows} rows of data/real_fc/sft_val.jsonl "
        f"before the first step and after the last. Step time: the median of steps 2 .. N. "
        f"Ratio, Δ log p (abs(log p_engine - log p_trainer)) and the corrections' shares are "
        f"means over the steps; token staleness: the mean lag of the trained tokens behind "
        f"the actor (async). "
        f"Sync runs colocated (one process, both cores); async on split pools (one core "
        f"each).", "", table, "", *verdicts, ""])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    plan = modes(args)
    if args.dry_run:
        print(f"async vs sync on SmolLM2: {len(plan)} runs of {args.steps} steps "
              f"({', '.join(label(m, k) for m, k in plan)}) -> {args.output}")
        for m, k in plan:
            print(f"{label(m, k)}: configs/real_fc.yaml + "
                  + " ".join(overrides(args, m, k, Path("val.jsonl"))))
        return 0
    missing = [p for p in (MODEL / "config.json", DATA / "sft_val.jsonl",
                           DATA / "rl_unfit.jsonl", DATA / "sft_train.jsonl") if not p.exists()]
    if missing:
        print(f"missing {', '.join(str(p.relative_to(ROOT)) for p in missing)}: run "
              f"`make real-fc-data` first", file=sys.stderr)
        return 1
    benchlib.set_bench_env()
    import torch
    import vllm

    machine = benchlib.machine_label(torch=torch.__version__, vllm=vllm.__version__)
    command = benchlib.command_line("bench_async_real.py", argv)
    val_file = held_out_file(args)
    raw: dict[str, Any] = {"runs": []}
    for mode, k in plan:
        print(f"--- {label(mode, k)}", flush=True)
        raw["runs"].append(run_one(args, mode, k, val_file))
        benchlib.save_raw("async_real", raw)
    benchlib.write_result(args.output, render(raw, args, command, machine))
    print(json.dumps({label(r["mode"], r["staleness"]): summarize(r) for r in raw["runs"]},
                     indent=1))
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
