"""The quickstart's learning, recorded: held-out success per validation step and wall time of
`make demo`'s run (``toolrl train --config configs/quickstart.yaml``) per seed, and of the same
task in the other modes (pipeline, async, LoRA, an agent through the gateway) and through a
think-stripping template (`configs/calculator_think.yaml`, mode ``think``).

Each run is a whole ``toolrl train`` process from a clean run directory (it trains its own warm
start, as `make demo` does), alone on the machine. Results accumulate in
``benchmarks/results/quickstart.json`` (a rerun of a run replaces its entry; runs on another
CPU are kept apart by the machine they name) and are rendered into
``benchmarks/results/quickstart.md`` and ``docs/quickstart_success.png``, which the README and
the guides cite.

    .venv/bin/python benchmarks/quickstart_runs.py --runs sync:0 sync:1 sync:2 pipeline:0
    .venv/bin/python benchmarks/quickstart_runs.py --render-only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import benchlib

ROOT = benchlib.ROOT
RESULTS_JSON = benchlib.RESULTS_DIR / "quickstart.json"
PLOT = ROOT / "docs" / "quickstart_success.png"
# async mode's accounting, from the last step (cumulative) or over the steps
ASYNC_KEYS = ("async/submitted", "async/trained", "async/dropped_stale")
# mode -> (config, extra overrides ("{seed}" filled in), extra PYTHONPATH)
MODES: dict[str, tuple[str, tuple[str, ...], str | None]] = {
    "sync": ("configs/quickstart.yaml", (), None),
    "pipeline": ("configs/quickstart_pipeline.yaml", (), None),
    "async": ("configs/quickstart_async.yaml", (), None),
    "lora": ("configs/quickstart.yaml", ("actor.lora.rank=16", "actor.lr=2e-3"), None),
    "gateway": ("examples/openai_agent/config.yaml", (), "examples/openai_agent"),
    "anthropic": ("examples/anthropic_agent/config.yaml", (), "examples/anthropic_agent"),
    "agents_sdk": ("examples/agents_sdk_agent/config.yaml", (), "examples/agents_sdk_agent"),
    # DeepSeek-R1-Distill's tokenizer and think-stripping template, trained per_turn; each seed
    # builds its own compact-vocabulary model (its vocabulary comes from that seed's texts)
    "think": ("configs/calculator_think.yaml", ("model.path=models/tiny-deepseek-s{seed}",),
              None),
}


def run_one(mode: str, seed: int, out_root: Path, overrides: tuple[str, ...] = ()
            ) -> dict[str, Any]:
    """One ``toolrl train`` from a clean run directory; its validation curve and times."""
    config, extra, path = MODES[mode]
    extra = tuple(x.format(seed=seed) for x in extra)
    out = out_root / f"{mode}-seed{seed}"
    if out.exists():
        subprocess.run(["rm", "-rf", str(out)], check=True)
    cmd = [str(ROOT / ".venv/bin/toolrl"), "train", "--config", config, f"seed={seed}",
           f"trainer.output_dir={out}", *extra, *overrides]
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / path),
                                                          env.get("PYTHONPATH")]))
    log = benchlib.SCRATCH / f"quickstart-{mode}-{seed}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{mode} seed {seed} failed (exit {proc.returncode}); log: {log}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = {int(r["step"]): r["val/success"] for r in rows if "val/success" in r}
    steps = [r for r in rows if "timing/step_s" in r]
    stream = {k: steps[-1][k] for k in ASYNC_KEYS if steps and k in steps[-1]}
    if stream:
        stream["async/push_pause_s"] = benchlib.median(
            [r["async/push_pause_s"] for r in steps if "async/push_pause_s" in r])
        stream["async/staleness_max"] = max(r.get("async/staleness_max", 0) for r in steps)
    warm = out / "warm_start_metrics.json"
    warm_info = json.loads(warm.read_text()) if warm.exists() else {}
    return {"mode": mode, "seed": seed, "command": " ".join(
                [f"PYTHONPATH={path}"] * bool(path) + ["toolrl train --config", config,
                                                       f"seed={seed}", *extra,
                                                       *overrides]),
            "val_success": curve, "wall_s": seconds,
            "step_s_median": benchlib.median([r["timing/step_s"] for r in steps]),
            "stream": stream,
            "warm_start_steps": warm_info.get("steps"),
            "machine": benchlib.machine_label(), "cpu": _cpu(),
            "date": time.strftime("%Y-%m-%d")}


def _cpu() -> str:
    from toolrl.machine import this_machine

    return this_machine().cpu


def load(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text()) if path.exists() else []


def save(path: Path, entries: list[dict[str, Any]], new: dict[str, Any]
         ) -> list[dict[str, Any]]:
    key = (new["mode"], new["seed"], new["cpu"])
    entries = [e for e in entries if (e["mode"], e["seed"], e["cpu"]) != key] + [new]
    entries.sort(key=lambda e: (e["cpu"], list(MODES).index(e["mode"]), e["seed"]))
    path.write_text(json.dumps(entries, indent=1) + "\n")
    return entries


def render(entries: list[dict[str, Any]]) -> str:
    """The markdown report: one table per CPU, a row per run."""
    lines = ["# The quickstart's learning: held-out success per run", "",
             "Written by `benchmarks/quickstart_runs.py` from "
             "`benchmarks/results/quickstart.json`. Each row is one whole `toolrl train` run "
             "from a clean run directory (its own warm "
             "start, as `make demo`), alone on the machine: held-out greedy success on 128 tasks "
             "at each validation step, the gain from step 0 to the end, the wall time of the "
             "whole command and the median step.", ""]
    for cpu in sorted({e["cpu"] for e in entries}):
        runs = [e for e in entries if e["cpu"] == cpu]
        steps = sorted({int(s) for e in runs for s in e["val_success"]})
        lines += [f"## {cpu}", "", f"Machine: {runs[0]['machine']}.", ""]
        header = ["run", *(f"step {s}" for s in steps), "gain (points)", "wall time",
                  "median step", "date"]
        rows = []
        for e in runs:
            curve = {int(k): v for k, v in e["val_success"].items()}
            gain = 100 * (curve[max(curve)] - curve[min(curve)])
            rows.append([f"{e['mode']}, seed {e['seed']}",
                         *(f"{curve[s]:.3f}" if s in curve else "" for s in steps),
                         f"{gain:+.1f}", f"{e['wall_s'] / 60:.1f} min",
                         f"{e['step_s_median']:.1f} s", e["date"]])
        lines += [benchlib.md_table(header, rows), ""]
        streamed = [e for e in runs if e.get("stream")]
        if streamed:
            lines += ["Async runs (`trainer.mode: async`): groups submitted, trained and dropped "
                      "as stale by the end, the largest staleness of a trained sample, and the "
                      "median time a weight push held generation.", "",
                      benchlib.md_table(
                          ["run", "submitted", "trained", "dropped stale", "max staleness",
                           "push pause (median)"],
                          [[f"{e['mode']}, seed {e['seed']}",
                            *(int(e["stream"].get(k, 0)) for k in ASYNC_KEYS),
                            int(e["stream"]["async/staleness_max"]),
                            f"{1000 * e['stream']['async/push_pause_s']:.0f} ms"]
                           for e in streamed]), ""]
        sync = [e for e in runs if e["mode"] == "sync"]
        if sync:
            gains = [100 * (e["val_success"][max(e["val_success"], key=int)]
                            - e["val_success"][min(e["val_success"], key=int)]) for e in sync]
            lines += [f"Mean gain of the {len(sync)} sync seed(s): {sum(gains) / len(gains):+.1f} "
                      "points.", ""]
        lines += ["Commands:", "", *sorted({f"- `{e['command']}`" for e in runs}), ""]
    return "\n".join(lines)


def plot(entries: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sync = [e for e in entries if e["mode"] == "sync"]
    if not sync:
        return
    cpu = sync[-1]["cpu"]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for e in (e for e in sync if e["cpu"] == cpu):
        curve = sorted((int(k), v) for k, v in e["val_success"].items())
        ax.plot([s for s, _ in curve], [v for _, v in curve], marker="o",
                label=f"seed {e['seed']}")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("held-out greedy success")
    ax.set_ylim(0, 1)
    ax.set_title("make demo: Calculator, tiny model, CPU")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="*", default=[], metavar="MODE:SEED",
                   help=f"runs to make; modes: {', '.join(MODES)}")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "quickstart_runs")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides for every run (a smoke test: results go to --results)")
    p.add_argument("--results", type=Path, default=RESULTS_JSON,
                   help="the JSON the runs accumulate in (the .md beside it)")
    args = p.parse_args(argv)
    if args.set and args.results == RESULTS_JSON:
        p.error("--set changes the runs: write them elsewhere (--results)")
    benchlib.set_bench_env()
    entries = load(args.results)
    if not args.render_only:
        for spec in args.runs:
            mode, _, seed = spec.partition(":")
            if mode not in MODES or not seed.isdigit():
                p.error(f"--runs: {spec!r} is not MODE:SEED with MODE one of {list(MODES)}")
            print(f"{mode} seed {seed} ...", file=sys.stderr, flush=True)
            entries = save(args.results, entries,
                           run_one(mode, int(seed), args.out, tuple(args.set)))
    benchlib.write_result(args.results.with_suffix(".md"), render(entries))
    if args.results == RESULTS_JSON:
        plot(entries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
