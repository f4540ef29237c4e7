"""How a toolrl GRPO step's cost grows: step time against batch size, turns per episode and
the number of rollout workers (with plots).

The trainer (Ray, vLLM CPU engine, FSDP2 actor, weight push every step; configs/quickstart.yaml
with overrides) runs on ``toolrl-bench/Turns-v0`` (benchlib): every model message is one real
tool call and the episode ends after the row's ``turns`` turns, so the untrained tiny model
plays exactly the requested number of turns of ``--tokens`` sampled tokens each (its
samples rarely hit eos). One trainer serves the batch-size and turns sweeps: its task loader
is swapped between steps and the sweep points take turns (point a, b, c, a, b, c, ...), so load
from other processes hits them alike. The worker sweep needs one trainer per worker count
(``resources.processes_per_node``: each process holds an actor rank and a rollout engine);
those trainers live side by side in one Ray cluster and take turns too.

    .venv/bin/python benchmarks/bench_scaling.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import ROOT, TURNS_ENV_ID, md_table, median

RESULTS = benchlib.RESULTS_DIR / "scaling.md"
PHASES = ("rollout", "reward", "log_probs", "advantage", "update", "sync")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer points and repetitions")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[2, 4, 8, 16],
                   help="tasks per step (each sampled --group-size times)")
    p.add_argument("--turns", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--default-batch", type=int, default=8)
    p.add_argument("--default-turns", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32, help="max sampled tokens per turn")
    p.add_argument("--reps", type=int, default=3, help="measured steps per point")
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--from-raw", type=Path, metavar="JSON",
                   help="run nothing: rewrite the report and plots from a run's raw results "
                        f"(saved as {benchlib.SCRATCH / 'raw' / 'scaling.json'})")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.turns, args.workers = [2, 4], [1, 2], [1]
        args.default_batch, args.default_turns, args.reps = 2, 1, 1
    return args


def points(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(tasks per step, turns) of the batch sweep and the turns sweep, each once."""
    pts = [(b, args.default_turns) for b in args.batch_sizes]
    pts += [(args.default_batch, t) for t in args.turns]
    return list(dict.fromkeys(pts))


def overrides(args: argparse.Namespace, out: Path, workers: int, model: Path) -> list[str]:
    max_turns = max([*args.turns, args.default_turns])
    # each turn: the sampled tokens + the tool result's template delta (~12 tokens)
    budget = max_turns * (args.tokens + 16)
    over = {
        "model.path": str(model), "warm_start.enabled": False,
        "env.id": TURNS_ENV_ID, "data.train_size": 256, "data.val_size": 4,
        "data.batch_size": args.default_batch, "algorithm.group_size": args.group_size,
        "rollout.max_tokens_per_turn": args.tokens, "rollout.max_turns": max_turns,
        "rollout.max_total_tokens": 2 * budget, "rollout.engine.max_model_len": 2 * budget,
        "trainer.total_steps": 10**6, "trainer.output_dir": str(out),
        "trainer.trackers": "[jsonl]", "trainer.log_rollouts": 0, "trainer.export_hf": False,
        "rollout.engine.kv_cache_gib": 0.25,  # ~30 MiB needed; several engines coexist
        "resources.processes_per_node": workers, "resources.ray_num_cpus": 8,
        "reward": "{rewards: [{name: success}]}",
    }
    return [f"{k}={v}" for k, v in over.items()]


def trainer_config(args: argparse.Namespace, out: Path, workers: int, model: Path) -> Any:
    """The quickstart with `overrides`, on the Turns env's own task kwargs (an override would
    merge into the quickstart's Calculator kwargs, which the Turns env refuses)."""
    from toolrl.trainer.config import load_config

    cfg = load_config(ROOT / "configs" / "quickstart.yaml", overrides(args, out, workers, model))
    cfg.data.task_kwargs = {"turns": args.default_turns}
    return cfg


def run_trainers(args: argparse.Namespace, pts: list[tuple[int, int]]) -> dict[str, Any]:
    """One trainer per worker count, all alive at once in one Ray cluster; every round takes
    one step of each (trainer, point) in turn. The first trainer serves every point, the
    others the default point."""
    from toolrl.controller import init_ray, shutdown_ray
    from toolrl.data import TaskLoader
    from toolrl.trainer.trainer import Trainer

    env_cls = benchlib.register_bench_envs()
    # Every Ray worker registers the bench env at start-up (it imports benchlib from here).
    path = os.pathsep.join(filter(None, [str(benchlib.BENCH_DIR), os.environ.get("PYTHONPATH")]))
    init_ray(num_cpus=8, runtime_env={
        "worker_process_setup_hook": "benchlib.register_bench_envs",
        "env_vars": {"PYTHONPATH": path, **{k: os.environ[k] for k in benchlib.BENCH_ENV}}})
    model = benchlib.tiny_model("small")
    trainers: dict[int, Any] = {}
    plan: list[tuple[int, tuple[int, int]]] = []
    for i, w in enumerate(args.workers):
        plan += [(w, p) for p in (pts if i == 0 else [(args.default_batch, args.default_turns)])]
    loaders = {(w, p): TaskLoader(env_cls.make_tasks(64, seed=0, turns=p[1]), p[0], seed=0)
               for w, p in plan}
    results: dict[tuple[int, tuple[int, int]], list[dict[str, float]]] = {k: [] for k in plan}
    try:
        for w in args.workers:
            out = Path(tempfile.mkdtemp(prefix=f"toolrl-bench-scaling-{w}-"))
            trainers[w] = Trainer(trainer_config(args, out, w, model))
            trainers[w].setup()
        for rep in range(args.reps + 1):  # the first round warms up
            for w, p in plan:
                trainer = trainers[w]
                trainer.loader = loaders[(w, p)]
                metrics = trainer.train_step()
                trainer.step += 1
                row = {k[len("timing/"):-2]: v for k, v in metrics.items()
                       if k.startswith("timing/")}
                row["step"] = sum(row.values())
                row["tokens"] = metrics.get("rollout/sampled_tokens", float("nan"))
                row["turns"] = metrics.get("rollout/turns_mean", float("nan"))
                if rep:
                    results[(w, p)].append(row)
                print(f"workers {w} batch {p[0]} turns {p[1]}: {row['step']:.2f} s"
                      + ("" if rep else " (warm-up)"), flush=True)
        threads = {w: benchlib.actor_threads(t) for w, t in trainers.items()}
    finally:
        for trainer in trainers.values():
            if trainer.tracker is not None:
                trainer.tracker.close()
            trainer.close()
        shutdown_ray()
    return {"workers": {str(w): {"threads": threads[w], "points": {
        f"{b}x{t}": rows for (w2, (b, t)), rows in results.items() if w2 == w}}
        for w in args.workers}}


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = rows[0].keys() if rows else []
    return {k: median([r[k] for r in rows]) for k in keys}


def plot(series: dict[str, list[tuple[float, dict[str, float]]]], xlabel: dict[str, str]
         ) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, pts in series.items():
        if len(pts) < 2:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.4))
        xs = [x for x, _ in pts]
        ax.plot(xs, [m["step"] for _, m in pts], "o-", color="black", label="step")
        for phase in ("rollout", "log_probs", "update", "sync"):
            if all(phase in m for _, m in pts):
                ax.plot(xs, [m[phase] for _, m in pts], ".--", label=phase)
        ax.set_xlabel(xlabel[name])
        ax.set_ylabel("seconds per step (median)")
        ax.set_title(f"toolrl GRPO step time vs {xlabel[name]}")
        ax.set_xticks(xs)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(benchlib.save_plot(fig, f"scaling_{name}"))
        plt.close(fig)
    return paths


def report(raw: dict[str, Any], args: argparse.Namespace, argv: list[str], machine: str
           ) -> str:
    base = raw["workers"][str(args.workers[0])]["points"]
    batch = [(b, medians(base[f"{b}x{args.default_turns}"])) for b in args.batch_sizes]
    turns = [(t, medians(base[f"{args.default_batch}x{t}"])) for t in args.turns]
    point = f"{args.default_batch}x{args.default_turns}"
    workers = [(w, medians(raw["workers"][str(w)]["points"][point])) for w in args.workers
               if point in raw["workers"][str(w)]["points"]]
    paths = plot({"batch": batch, "turns": turns, "workers": workers},
                 {"batch": "tasks per step", "turns": "turns per episode",
                  "workers": "rollout workers (= actor ranks)"})

    def best(rows: list[dict[str, float]]) -> float:
        return min(r["step"] for r in rows) if rows else float("nan")

    fastest = {"batch": {b: best(base[f"{b}x{args.default_turns}"]) for b in args.batch_sizes},
               "turns": {t: best(base[f"{args.default_batch}x{t}"]) for t in args.turns},
               "workers": {w: best(raw["workers"][str(w)]["points"].get(point, []))
                           for w in args.workers}}

    def table(label: str, pts: list[tuple[int, dict[str, float]]], sweep: str) -> str:
        first = pts[0][1]["step"] if pts else 1.0
        rows = [(x, m["step"], f"{m['step'] / first:.2f}x", fastest[sweep][x],
                 m.get("rollout", 0.0),
                 m.get("log_probs", 0.0), m.get("update", 0.0), m.get("sync", 0.0),
                 m["tokens"], m["tokens"] / m["rollout"] if m.get("rollout") else float("nan"))
                for x, m in pts]
        return md_table([label, "step (s)", "vs first", "fastest step (s)", "rollout (s)",
                         "log-probs (s)",
                         "update (s)", "sync (s)", "sampled tokens", "rollout tok/s"], rows)

    def growth(pts: list[tuple[int, dict[str, float]]], what: str) -> str:
        (x0, m0), (x1, m1) = pts[0], pts[-1]
        return (f"{m1['step'] / m0['step']:.1f}x from {x0} to {x1} {what} "
                f"({x1 / x0:.0f}x the episodes' work)")

    head = []
    if len(batch) > 1:
        head.append(growth(batch, "tasks per step"))
    if len(turns) > 1:
        head.append(growth(turns, "turns per episode"))
    threads = ", ".join(f"{w} worker(s): {raw['workers'][str(w)]['threads']}"
                        for w in args.workers)
    lines = [
        "# Scaling: toolrl GRPO step time vs batch size, turns and rollout workers",
        "",
        f"Machine: {machine}.",
        "",
        f"Command: `{benchlib.command_line('bench_scaling.py', argv)}`",
        "",
        f"`{TURNS_ENV_ID}` (every message is one tool call; the row sets the turns), the "
        f"untrained tiny model, {args.group_size} samples per task, up to {args.tokens} sampled "
        f"tokens per turn; median of {args.reps} steps per point after a warm-up round, points "
        f"taken in turn (phases: medians; fastest step: the least disturbed repetition, a "
        f"better guide on a loaded machine). torch threads per actor process (Ray sets "
        f"OMP_NUM_THREADS to `resources.cpus_per_process`): {threads}.",
        "",
        *([f"**Step time grows {' and '.join(head)}.**", ""] if head else []),
        f"## Batch size ({args.default_turns} turns per episode)",
        "",
        table("tasks per step", batch, "batch"),
        "",
        f"## Turns per episode ({args.default_batch} tasks per step)",
        "",
        table("turns", turns, "turns"),
        "",
    ]
    if len(workers) > 1:
        lines += [f"## Rollout workers ({args.default_batch} tasks, {args.default_turns} turns)",
                  "", table("workers", workers, "workers"), "",
                  f"The machine has {os.cpu_count()} cores. Each worker process holds an "
                  "actor rank (one torch thread: one CPU per process) and a vLLM engine, so "
                  "more workers use more cores until there are none left; beyond that they "
                  "only add processes.", ""]
    lines += ["Plots: " + ", ".join(f"`benchmarks/plots/{p.name}`" for p in paths), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    pts = points(args)
    if args.dry_run:
        print(f"scaling plan: points (tasks, turns) {pts}, workers {args.workers}, "
              f"{args.reps} reps -> {args.output}")
        print("toolrl train --config configs/quickstart.yaml "
              + " ".join(overrides(args, Path("out"), args.workers[0],
                                   benchlib.MODELS_DIR / "tiny")))
        return 0
    if args.from_raw:
        raw = json.loads(args.from_raw.read_text())
        argv = raw.get("argv", [])
        benchlib.write_result(RESULTS, report(raw, parse_args(argv), argv, raw["machine"]))
        return 0
    benchlib.set_bench_env()
    machine = benchlib.machine_label()
    raw = run_trainers(args, pts)
    raw.update(machine=machine, argv=argv)
    benchlib.save_raw("scaling", raw)
    benchlib.write_result(args.output, report(raw, args, argv, machine))
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
