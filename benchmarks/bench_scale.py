"""Real model sizes: the Qwen2.5-0.5B shape trained on CPU, memory per process, weight push.

Five measurements, each against `toolrl.trainer.memory`'s pre-flight plan:

- **train**: ``configs/scale_0p5b_cpu.yaml`` (494M parameters, the real 151,936-token
  vocabulary, random weights; the quickstart's colocated layout: 2 tasks x 4 samples, 40 tokens
  per turn, 3 turns) for ``--steps`` GRPO steps: seconds per phase (rollout, reward, log-probs,
  advantage, update, sync) and the peak resident memory (the kernel's high-water mark,
  ``VmHWM``) of every process: the driver, Ray's own processes, the worker hosting the actor
  and the rollout client, and vLLM's engine core;
- **tiny**: the same layout with the tiny model, so the plan is compared at both ends;
- **plain**: the 0.5B shape as a user would first write it: no gradient checkpointing, the
  default LM-head chunks, micro-batches of 4;
- **smollm2**: the real-model recipe's config (``configs/real_fc.yaml``: SmolLM2-135M-Instruct)
  at the size it was first measured at (NESTFUL's rows, 4 tasks x 4 = 16 samples of up to 1,700
  tokens a step, micro-batches of 4; `SMOLLM2_OVERRIDES`) with a short warm start (SFT in
  the driver) before its GRPO steps, so the driver's warm-start phase is measured too;
- **push**: one process holding an FSDP2 actor of the 0.5B shape and a vLLM engine (the
  colocated route); for each bucket size, the peak extra memory of a weight push in the actor's
  process and in the engine core (high-water mark reset before the push, minus the resident
  size before it) and its time.

    .venv/bin/python benchmarks/bench_scale.py [--quick] [--sections train tiny plain smollm2 push]

Needs ~16 GB of free memory for the 0.5B sections (``--quick``: the tiny run only); the
smollm2 section needs ``make smollm2`` and the recipe's rows (``make real-fc-data``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import md_table, median

RESULTS = benchlib.RESULTS_DIR / "scale.md"
CONFIG = benchlib.ROOT / "configs" / "scale_0p5b_cpu.yaml"
REAL_FC = benchlib.ROOT / "configs" / "real_fc.yaml"
SHAPE = "qwen2.5-0.5b"
PHASES = ("rollout", "reward", "log_probs", "advantage", "update", "sync")
GiB = float(1 << 30)


# --- process memory ----------------------------------------------------------------------------
def status(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` field in bytes (0 if gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak(pid: int) -> None:
    """Reset the process's high-water mark (``VmHWM``) to its current resident size."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def descendants(pid: int) -> list[int]:
    import psutil

    with contextlib.suppress(psutil.Error):
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    return []


def trainer_processes(trainer: Any) -> dict[str, list[int]]:
    """The run's processes by role: driver, worker(s), engine core(s), Ray's own."""
    from toolrl.rollout.worker import RolloutWorker

    workers = list(trainer.actor.group.pids)
    engines = [p for pids in trainer.handles["rollout"].call(RolloutWorker.engine_pids)
               for p in pids]
    mine = set(workers) | set(engines) | {q for w in workers for q in descendants(w)}
    ray = [p for p in descendants(os.getpid()) if p not in mine]
    return {"driver": [os.getpid()], "Ray system processes": ray,
            "worker: actor + rollout": workers, "vLLM engine core": engines}


class TotalSampler:
    """The resident memory of this process and all its descendants (Ray's processes, workers,
    engine cores) summed, sampled every ``every`` seconds in a thread: the peak of what the run
    holds at one moment, which the plan's total (its busiest phase) predicts. Per-process peaks
    are reached at different moments (the warm start before the workers exist, the engine's
    push after the update), so their sum over-counts."""

    def __init__(self, every: float = 0.25) -> None:
        import threading

        self.every, self.peak = every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            self.peak = max(self.peak, total)
            self._stop.wait(self.every)

    def __enter__(self) -> TotalSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- train ---------------------------------------------------------------------------------
def train(config: Path, steps: int, overrides: list[str], label: str) -> dict[str, Any]:
    from toolrl.trainer.config import load_config
    from toolrl.trainer.memory import check_memory
    from toolrl.trainer.tracking import read_metrics
    from toolrl.trainer.trainer import Trainer

    out = benchlib.SCRATCH / f"scale-{label}"
    shutil.rmtree(out, ignore_errors=True)  # a warm start kept there would be reused
    cfg = load_config(config, [f"trainer.output_dir={out}", f"trainer.total_steps={steps}",
                               "trainer.resume=never", *overrides])
    plan = check_memory(cfg)
    for pid in [os.getpid(), *descendants(os.getpid())]:
        reset_peak(pid)
    start = time.perf_counter()
    with TotalSampler() as sampler:
        trainer = Trainer(cfg)
        try:
            trainer.fit()
            procs = trainer_processes(trainer)
            peaks = {role: [status(p, "VmHWM") for p in pids] for role, pids in procs.items()}
        finally:
            trainer.close()
    rows = [r for r in read_metrics(cfg.run_dir / "metrics.jsonl") if r["step"] >= 1]
    timing = {ph: [r.get(f"timing/{ph}_s", float("nan")) for r in rows] for ph in PHASES}
    timing["step"] = [r["timing/step_s"] for r in rows]
    planned = {p.name: p.peak for p in plan.processes if not p.gpu} if plan else {}
    return {"label": label, "steps": len(rows), "seconds": time.perf_counter() - start,
            "timing": timing, "peaks": peaks, "planned": planned,
            "plan_total": plan.host_total if plan else float("nan"),
            "sampled_total": sampler.peak,
            "plan_summary": plan.summary() if plan else "",
            "config": [str(config), *overrides]}


# the 0.5B shape without the config's memory savings, as a first config would be written
PLAIN_OVERRIDES = ["actor.gradient_checkpointing=false", "actor.logits_chunk_size=null",
                   "actor.micro_batch_size=4"]
# the recipe's config as it trains, with a warm start cut to a few steps (its own folder, so
# no earlier warm start is reused) and no checkpoints or validation between the steps
# the recipe's config at the size it was measured at: NESTFUL's rows, 4 tasks x 4 samples
SMOLLM2_OVERRIDES = ["warm_start.steps=4", "warm_start.eval_every=0", "warm_start.val_file=null",
                     "warm_start.num_transcripts=64", "warm_start.output=null",
                     "warm_start.train_file=data/real_fc/nestful_train.jsonl",
                     "data.train_file=data/real_fc/nestful_train.jsonl",
                     "data.val_file=data/real_fc/nestful_val.jsonl", "data.batch_size=4",
                     "algorithm.group_size=4", "algorithm.filter_groups=false",
                     "trainer.val_every=0",
                     "trainer.save_every=0"]


# --- push ----------------------------------------------------------------------------------
def push(buckets_mb: list[float], reps: int) -> dict[str, Any]:
    import torch

    from toolrl.models.tiny import build_tiny_model
    from toolrl.rollout.engine import EngineConfig, VLLMEngine
    from toolrl.workers.actor import ActorConfig, FSDPActor
    from toolrl.workers.fsdp import init_distributed

    init_distributed()
    model = build_tiny_model(benchlib.MODELS_DIR / SHAPE, size=SHAPE)
    actor = FSDPActor(ActorConfig(model_path=str(model)))
    engine = VLLMEngine(EngineConfig(model=str(model), max_model_len=256, kv_cache_gib=0.25,
                                     multiprocessing=False, seed=0))
    me, core = os.getpid(), engine.engine_pids
    meta = actor.weights.metadata()  # what a push sends (the tied lm_head only once)
    sizes = [torch.Size(shape).numel() * 4 for _, _, shape in meta]
    results = []
    try:
        engine.generate_sync([1, 2, 3, 4], timeout=300)
        for mb in buckets_mb:
            engine.config.weight_bucket_mb = mb
            runs = []
            for _ in range(reps):
                base = {p: status(p, "VmRSS") for p in (me, *core)}
                for p in base:
                    reset_peak(p)
                start = time.perf_counter()
                actor.weights.push_local([engine.weights])
                seconds = time.perf_counter() - start
                extra = {p: status(p, "VmHWM") - base[p] for p in base}
                runs.append({"seconds": seconds, "actor_extra": extra[me],
                             "engine_extra": sum(extra[p] for p in core),
                             "buckets": engine.weights.last_push_buckets})
            results.append({"bucket_mb": mb, "runs": runs})
        engine.generate_sync([1, 2, 3, 4], timeout=300)  # still serving after the pushes
    finally:
        engine.shutdown()
    return {"weights_bytes": sum(sizes), "largest_tensor_bytes": max(sizes), "results": results}


# --- report --------------------------------------------------------------------------------
def _relative(arg: str) -> str:
    """Paths inside the repository as the command line from its root would spell them."""
    return arg.replace(str(benchlib.ROOT) + os.sep, "")


def _gib(x: float) -> str:
    return f"{x / GiB:.2f}"


def train_section(r: dict[str, Any]) -> list[str]:
    t = r["timing"]
    rows = [(ph.replace("_", "-"), median(t[ph]), max(t[ph])) for ph in (*PHASES, "step")]
    mem = []
    total_meas = total_plan = 0.0
    for role, peaks in r["peaks"].items():
        meas = sum(peaks)
        plan = r["planned"].get(role, float("nan")) * max(len(peaks), 1) \
            if role != "Ray system processes" else r["planned"].get(role, float("nan"))
        total_meas += meas
        total_plan += plan
        mem.append((role, len(peaks), _gib(meas), _gib(plan), f"{meas / plan:.2f}"))
    mem.append(("sum of the peaks above", "", _gib(total_meas), _gib(total_plan),
                f"{total_meas / total_plan:.2f}"))
    at_once = r.get("sampled_total", float("nan"))
    mem.append(("**all processes at once** (sampled every 0.25 s; plan: its busiest phase)", "",
                f"**{_gib(at_once)}**", f"**{_gib(r['plan_total'])}**",
                f"**{at_once / r['plan_total']:.2f}**"))
    return [
        f"Config: `{' '.join(_relative(c) for c in r['config'])}`, {r['steps']} steps, "
        f"{r['seconds']:.0f} s in all (engine and actor start-up, validation before and after "
        f"included).",
        "",
        md_table(["phase", "median s/step", "max s/step"], rows),
        "",
        "Peak resident memory (VmHWM) of every process, and the pre-flight plan's peak of it "
        f"({r['plan_summary']}). Processes peak at different moments, so the last row, the "
        "resident memory of all of them summed at one moment, is what the plan's total "
        "predicts:",
        "",
        md_table(["process", "n", "measured GiB", "planned GiB", "measured / planned"], mem),
    ]


def push_section(r: dict[str, Any]) -> list[str]:
    rows = []
    largest = r["largest_tensor_bytes"]
    for b in r["results"]:
        bucket = b["bucket_mb"] * 2**20
        actor = max(x["actor_extra"] for x in b["runs"])
        engine = max(x["engine_extra"] for x in b["runs"])
        bound = 2 * max(bucket, largest) + 2 * largest
        rows.append((f"{b['bucket_mb']:.0f}", b["runs"][0]["buckets"],
                     median([x["seconds"] for x in b["runs"]]), _gib(actor), _gib(engine),
                     _gib(actor + engine), _gib(bound), f"{(actor + engine) / bound:.2f}"))
    return [
        f"FSDP2 actor ({r['weights_bytes'] / GiB:.2f} GiB of fp32 weights to push, largest "
        f"tensor {largest / GiB:.2f} GiB: the tied embedding) and a vLLM engine (fp32) in one "
        "process (the colocated route); per bucket size the worst of the repetitions. Bound: "
        "2 x the staged bucket (a bucket is at least the largest tensor) + 2 x the largest "
        "tensor (the engine rebuilds a reloaded layer, and the CPU-packed copy of the tied "
        "embedding, beside the old one):",
        "",
        md_table(["bucket MiB", "buckets", "push s (median)", "actor process extra GiB",
                  "engine core extra GiB", "total extra GiB", "bound GiB",
                  "extra / bound"], rows),
        "",
        "The staging file of a bucket is shared memory: it counts in the actor process (which "
        "writes it) and again in the engine core (which maps it), so the total counts it twice.",
    ]


def report(results: dict[str, Any], machine: str, argv: list[str]) -> str:
    lines = ["# Real model sizes: Qwen2.5-0.5B's shape on CPU", "",
             f"Machine: {machine}.", "",
             f"Command: `{benchlib.command_line('bench_scale.py', argv)}`", ""]
    head = []
    if "train" in results:
        r = results["train"]
        total = sum(sum(v) for v in r["peaks"].values())
        worker = sum(r["peaks"]["worker: actor + rollout"])
        core = sum(r["peaks"]["vLLM engine core"])
        head.append(f"0.5B shape, {r['steps']} GRPO steps without an OOM: peak RSS actor/"
                    f"rollout process {_gib(worker)} GiB, engine core {_gib(core)} GiB, sum of "
                    f"the process peaks {_gib(total)} GiB, all processes at once "
                    f"{_gib(r.get('sampled_total', float('nan')))} GiB (plan "
                    f"{_gib(r['plan_total'])}); step {median(r['timing']['step']):.0f} s")
    if "push" in results:
        parts = []
        largest = results["push"]["largest_tensor_bytes"]
        for b in results["push"]["results"]:
            extra = max(x["actor_extra"] + x["engine_extra"] for x in b["runs"])
            staged = max(b["bucket_mb"] * 2**20, largest)
            parts.append(f"{b['bucket_mb']:.0f} MiB buckets {_gib(extra)} GiB "
                         f"({extra / staged:.1f}x the staged bucket)")
        head.append("weight push peak extra memory: " + ", ".join(parts))
    if head:
        lines += ["**" + "; ".join(head) + ".**", ""]
    if "train" in results:
        lines += ["## Training: the 0.5B shape, colocated", "", *train_section(results["train"]),
                  ""]
    if "tiny" in results:
        lines += ["## Training: the tiny model, same layout", "", *train_section(results["tiny"]),
                  ""]
    if "plain" in results:
        lines += ["## Training: the 0.5B shape, a plain config", "",
                  *train_section(results["plain"]), ""]
    if "smollm2" in results:
        lines += ["## Training: SmolLM2-135M-Instruct, the real-model recipe's config", "",
                  *train_section(results["smollm2"]), ""]
    if "push" in results:
        lines += ["## Weight push: peak extra memory vs bucket size", "",
                  *push_section(results["push"]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tiny run only, 2 steps")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    sections = ["train", "tiny", "plain", "smollm2", "push"]
    p.add_argument("--sections", nargs="+", choices=sections, default=sections)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--buckets", nargs="+", type=float, default=[64, 256, 1024])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.sections, args.steps = ["tiny"], min(args.steps, 2)
    if args.dry_run:
        print(f"scale plan: {args.sections}, {args.steps} steps, buckets {args.buckets} MiB "
              f"-> {args.output}")
        return 0
    benchlib.set_bench_env()
    import torch
    import vllm

    machine = benchlib.machine_label(torch=torch.__version__, vllm=vllm.__version__)
    results: dict[str, Any] = {}
    if "train" in args.sections:
        results["train"] = train(CONFIG, args.steps, [], "0p5b")
    if "tiny" in args.sections:
        tiny = benchlib.tiny_model("small")
        results["tiny"] = train(CONFIG, args.steps, [f"model.path={tiny}", "model.tiny_size=small",
                                                     "rollout.engine.dtype=float32"], "tiny")
    if "plain" in args.sections:
        results["plain"] = train(CONFIG, args.steps, PLAIN_OVERRIDES, "plain")
    if "smollm2" in args.sections:
        missing = [p for p in ("models/smollm2-135m-instruct", "data/real_fc/nestful_train.jsonl")
                   if not (benchlib.ROOT / p).exists()]
        if missing:
            print(f"smollm2 section skipped: {', '.join(missing)} missing (make smollm2 "
                  f"real-fc-data)", file=sys.stderr)
        else:
            results["smollm2"] = train(REAL_FC, args.steps, SMOLLM2_OVERRIDES, "smollm2")
    if "push" in args.sections:
        results["push"] = push(args.buckets, args.reps)
    benchlib.save_raw("scale", {"machine": machine, "argv": argv, "results": results})
    benchlib.write_result(args.output, report(results, machine, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
