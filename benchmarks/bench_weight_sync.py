"""Weight sync time against model size: FSDP2 actor -> colocated vLLM CPU engine.

For each size of the tiny family (small, medium, large) one process holds an `FSDPActor` (a
world of one, gloo) and a `VLLMEngine`, the colocated layout the trainer uses on one machine.
Measured, alternating, the median of ``--reps``:

- push: `WeightSync.push_local` (gather the weights tensor by tensor, stage them bucket by
  bucket in shared memory, reload each bucket in the engine's worker, re-pack the CPU embedding
  GEMM, reset the prefix cache);
- of which gather: the full weights from the FSDP2 shards alone;
- the alternative a framework without in-place sync has: restarting the engine on a new
  checkpoint (the engine's start-up time, measured once per size; saving the checkpoint not
  included).

    .venv/bin/python benchmarks/bench_weight_sync.py [--quick] [--sizes small medium large]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import md_table, median

RESULTS = benchlib.RESULTS_DIR / "weight_sync.md"
SIZES = ("small", "medium", "large")


def measure(size: str, reps: int) -> dict[str, Any]:
    from toolrl.rollout.engine import EngineConfig, VLLMEngine
    from toolrl.workers.actor import ActorConfig, FSDPActor
    from toolrl.workers.fsdp import init_distributed

    init_distributed()
    model = benchlib.tiny_model(size)
    actor = FSDPActor(ActorConfig(model_path=str(model)))
    params = sum(p.numel() for p in actor.model.parameters())
    nbytes = sum(t.numel() * t.element_size() for _, t in actor.weights.iter_full())
    start = time.perf_counter()
    engine = VLLMEngine(EngineConfig(model=str(model), max_model_len=256, kv_cache_gib=0.25,
                                     multiprocessing=False, seed=0))
    engine_start = time.perf_counter() - start
    try:
        prompt = [1, 2, 3, 4]
        engine.generate_sync(prompt, timeout=120)
        push, gather = benchlib.timed_alternating(
            [lambda: actor.weights.push_local([engine.weights]),
             lambda: list(actor.weights.iter_full())], reps)
        engine.generate_sync(prompt, timeout=120)  # still serving after the pushes
        version = engine.weight_version
    finally:
        engine.shutdown()
    return {"size": size, "params": params, "mib": nbytes / 2**20, "push_s": median(push),
            "gather_s": median(gather), "engine_start_s": engine_start,
            "pushes": version, "push_all": push}


def plot(results: list[dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    mib = [r["mib"] for r in results]
    ax.plot(mib, [r["push_s"] * 1e3 for r in results], "o-", label="push (total)")
    ax.plot(mib, [r["gather_s"] * 1e3 for r in results], ".--", label="of which gather")
    for r in results:
        ax.annotate(r["size"], (r["mib"], r["push_s"] * 1e3), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    ax.set_xlabel("weights (MiB, fp32)")
    ax.set_ylabel("milliseconds (median)")
    ax.set_title("weight sync: FSDP2 actor -> vLLM CPU engine")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = benchlib.save_plot(fig, "weight_sync")
    plt.close(fig)
    return path


def report(results: list[dict[str, Any]], machine: str, argv: list[str], reps: int) -> str:
    rows = []
    for r in results:
        rows.append((r["size"], f"{r['params'] / 1e6:.2f}M", f"{r['mib']:.1f}",
                     r["push_s"] * 1e3, r["gather_s"] * 1e3,
                     (r["push_s"] - r["gather_s"]) * 1e3, r["mib"] / r["push_s"],
                     r["engine_start_s"], f"{r['engine_start_s'] / r['push_s']:.0f}x"))
    first, last = results[0], results[-1]
    growth = (f"From {first['size']} to {last['size']} the weights grow "
              f"{last['mib'] / first['mib']:.1f}x and the push time "
              f"{last['push_s'] / first['push_s']:.1f}x.") if len(results) > 1 else ""
    head = "; ".join(f"{r['size']} ({r['mib']:.0f} MiB) {r['push_s'] * 1e3:.0f} ms"
                     for r in results)
    restart = min(r["engine_start_s"] / r["push_s"] for r in results)
    return "\n".join([
        "# Weight sync: FSDP2 actor -> colocated vLLM CPU engine",
        "",
        f"Machine: {machine}.",
        "",
        f"Command: `{benchlib.command_line('bench_weight_sync.py', argv)}`",
        "",
        f"Median of {reps} pushes per size (fp32 weights, tied embeddings not sent twice), "
        "timed alternately with a gather-only pass. The restart column is what reloading a "
        "checkpoint by restarting the engine would cost instead (its start-up time).",
        "",
        md_table(["size", "params", "MiB", "push (ms)", "of which gather (ms)",
                  "stage + engine reload (ms)", "push MiB/s", "engine restart (s)",
                  "restart / push"], rows),
        "",
        f"**Weight push into the engine: {head}; restarting the engine instead would cost "
        f"at least {restart:.0f}x more.**",
        "",
        growth + " Gathering the full weights from the FSDP2 shards takes a few ms; the rest "
        "is staging them bucket by bucket in shared memory, one RPC per bucket into the "
        "engine's worker, vLLM's in-place reload (with the CPU re-packing of the GEMM weights) "
        "and the prefix-cache reset.",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions, small size only")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--sizes", nargs="+", choices=SIZES, default=list(SIZES))
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.sizes = min(args.reps, 2), args.sizes[:1]
    if args.dry_run:
        print(f"weight sync plan: sizes {args.sizes}, {args.reps} reps each -> {args.output}")
        return 0
    benchlib.set_bench_env()
    import torch
    import vllm

    machine = benchlib.machine_label(torch=torch.__version__, vllm=vllm.__version__)
    results = [measure(size, args.reps) for size in args.sizes]
    benchlib.save_raw("weight_sync", {"machine": machine, "argv": argv, "results": results})
    if len(results) > 1:
        plot(results)
    benchlib.write_result(args.output, report(results, machine, argv, args.reps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
