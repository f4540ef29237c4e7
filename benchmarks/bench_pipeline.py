"""Sync vs pipeline (one-step off-policy) vs async training: steps per minute on one config and
seeds.

Every mode runs configs/quickstart.yaml (GRPO on Calculator, the tiny model after a short warm
start so that episodes really call tools) with the same overrides and seed; only
``trainer.mode`` and the pools differ:

- ``sync``: actor and vLLM engine colocated in one process, one step is rollout -> train ->
  sync;
- ``pipeline``: the engine in a process (pool) of its own, rollout of batch k+1 overlaps
  training on batch k, then the weights go over a gloo broadcast group;
- ``pipeline-1t``: the same with OMP_NUM_THREADS=1 in the Ray workers, so the actor's torch
  keeps to one thread and leaves the other core to vLLM (which pins its own threads);
- ``async`` / ``async-1t``: ``trainer.mode=async`` (``--max-staleness``, default 2): the engine
  streams groups without a barrier, a step trains as soon as its batch can be formed, weights
  are pushed while episodes are in flight (with OMP_NUM_THREADS=1 for ``-1t``).

Ray reserves 1 CPU per process, but leaves OMP_NUM_THREADS unset (the report shows it): in
``sync`` and ``pipeline`` torch uses every core, so the sync loop has the whole machine for
each phase while the pipeline's two processes compete for it.

Two workloads: ``cpu`` (tools answer at once: rollout and update both compute on the same two
cores) and ``io`` (every tool call waits ``--tool-latency`` seconds, like a remote service, so
that the rollout takes about as long as the update without using the CPU), and ``lognormal``
(every tool call waits a log-normal time, mean ``--lognormal-mean`` s, sigma
``--lognormal-sigma``: a long tail, as real tools have, so a synchronous step waits for its
slowest episode). The modes run in
turn (sync, pipeline, pipeline-1t, sync, ...), so load from other processes hits them alike;
steps per minute counts steps 2 .. N-1 of each run (step 1 warms up and is not overlapped
in pipeline mode; step N has no next batch to overlap with).

    .venv/bin/python benchmarks/bench_pipeline.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import ROOT, md_table, median

RESULTS = benchlib.RESULTS_DIR / "pipeline.md"
SLOW_ENV_ID = "toolrl-bench/SlowCalculator-v0"
# mode -> (trainer.mode, OMP_NUM_THREADS of the Ray workers; None: unset, torch uses every core)
MODES: dict[str, tuple[str, int | None]] = {
    "sync": ("sync", None), "pipeline": ("pipeline", None), "pipeline-1t": ("pipeline", 1),
    "async": ("async", None), "async-1t": ("async", 1)}
WORKLOADS = ("cpu", "io", "lognormal")


def register_slow_calculator() -> type:
    """Register ``toolrl-bench/SlowCalculator-v0``: Calculator whose every turn waits
    ``latency_s`` (asyncio sleep: the episode waits, the CPU does not). Idempotent; a Ray worker
    setup hook."""
    from toolrl.envs.calculator import CalculatorEnv

    from toolrl.core.registration import register_env

    if "SlowCalculatorEnv" not in globals():
        class SlowCalculatorEnv(CalculatorEnv):
            """Calculator behind a slow service: each turn's tool calls take ``latency_s``,
            or with ``sigma`` > 0 a log-normal time of mean ``latency_s`` (drawn from the
            episode's seed)."""

            def __init__(self, *, latency_s: float = 0.0, sigma: float = 0.0,
                         **kwargs: Any) -> None:
                super().__init__(**kwargs)
                self.latency_s, self.sigma = float(latency_s), float(sigma)
                self._rng = random.Random()

            def reset(self, *, seed: int | None = None, **kwargs: Any) -> Any:
                self._rng = random.Random(seed)
                return super().reset(seed=seed, **kwargs)

            def latency(self) -> float:
                if self.sigma <= 0 or self.latency_s <= 0:
                    return self.latency_s
                mu = math.log(self.latency_s) - self.sigma ** 2 / 2  # mean latency_s
                return self._rng.lognormvariate(mu, self.sigma)

            async def astep(self, action: str) -> Any:
                delay = self.latency()
                if delay > 0:
                    await asyncio.sleep(delay)
                return await super().astep(action)

        SlowCalculatorEnv.__module__ = __name__
        globals()["SlowCalculatorEnv"] = SlowCalculatorEnv
    register_env(SLOW_ENV_ID, globals()["SlowCalculatorEnv"])
    return globals()["SlowCalculatorEnv"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one round of fewer steps")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--steps", type=int, default=8, help="steps per run (the first warms up)")
    p.add_argument("--rounds", type=int, default=2, help="runs of every mode, in turn")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    p.add_argument("--modes", nargs="+", default=["sync", "pipeline-1t", "async-1t"],
                   choices=list(MODES))
    p.add_argument("--tool-latency", type=float, default=2.5,
                   help="seconds every turn of the io workload waits")
    p.add_argument("--lognormal-mean", type=float, default=1.0,
                   help="mean seconds of a tool call in the lognormal workload")
    p.add_argument("--lognormal-sigma", type=float, default=1.0,
                   help="sigma of the lognormal workload's log-latency (its tail)")
    p.add_argument("--max-staleness", type=int, default=2, help="trainer.max_staleness (async)")
    p.add_argument("--batch-size", type=int, default=8, help="tasks per step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--warm-start-steps", type=int, default=150)
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 5, 1
    if args.steps < 3:
        p.error("--steps must be >= 3 (the first and the last step are not counted)")
    return args


def overrides(args: argparse.Namespace, out: Path, mode: str, workload: str,
              model: Path) -> list[str]:
    over: dict[str, Any] = {
        "model.path": str(model), "model.build_tiny_if_missing": False,
        "warm_start.enabled": False, "env.id": SLOW_ENV_ID,
        "env.kwargs": env_kwargs(args, workload),
        "data.batch_size": args.batch_size, "algorithm.group_size": args.group_size,
        "data.val_size": 8, "trainer.val_every": 0, "trainer.save_every": 0,
        "trainer.total_steps": args.steps, "trainer.output_dir": str(out),
        "trainer.trackers": "[jsonl]", "trainer.log_rollouts": 0, "trainer.export_hf": False,
        "trainer.resume": "never", "trainer.mode": MODES[mode][0],
        # the same loss in every mode (the pipeline and async quickstarts' correction)
        "actor.loss.corrections": "[{name: tis, cap: 2.0}]",
        "trainer.health.on_unhealthy": "warn",  # a speed benchmark: a drifting policy goes on
    }
    if MODES[mode][0] == "async":
        over["trainer.max_staleness"] = args.max_staleness
    return [f"{k}={v}" for k, v in over.items()]


def env_kwargs(args: argparse.Namespace, workload: str) -> str:
    if workload == "io":
        return f"{{latency_s: {args.tool_latency}}}"
    if workload == "lognormal":
        return f"{{latency_s: {args.lognormal_mean}, sigma: {args.lognormal_sigma}}}"
    return "{latency_s: 0.0}"


def run_one(args: argparse.Namespace, mode: str, workload: str, model: Path
            ) -> dict[str, Any]:
    """One trainer (on a Ray cluster of its own), ``args.steps`` steps; per-step timings and
    the processes' thread limits."""
    from toolrl.controller import init_ray, shutdown_ray
    from toolrl.trainer.config import load_config
    from toolrl.trainer.tracking import read_metrics
    from toolrl.trainer.trainer import Trainer

    out = Path(tempfile.mkdtemp(prefix=f"toolrl-bench-pipeline-{mode}-{workload}-"))
    cfg = load_config(ROOT / "configs" / "quickstart.yaml",
                      overrides(args, out, mode, workload, model))
    env = {k: os.environ[k] for k in benchlib.BENCH_ENV}
    # Every Ray worker registers the slow env at start-up (it imports this module from here).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(benchlib.BENCH_DIR),
                                                      os.environ.get("PYTHONPATH")]))
    if MODES[mode][1] is not None:
        env["OMP_NUM_THREADS"] = str(MODES[mode][1])
    init_ray(num_cpus=8, runtime_env={
        "worker_process_setup_hook": "bench_pipeline.register_slow_calculator",
        "env_vars": env})
    trainer = Trainer(cfg)
    try:
        trainer.setup()
        threads = {role: _omp_threads(h.group.pids) for role, h in trainer.handles.items()}
        trainer.fit()
    finally:
        trainer.close()
        shutdown_ray()
    rows = [r for r in read_metrics(out / "metrics.jsonl") if r["step"] >= 1]
    return {"mode": mode, "workload": workload, "threads": threads, "steps": rows}


def _omp_threads(pids: list[int]) -> str:
    """OMP_NUM_THREADS in the worker processes (Ray sets it from their CPU share)."""
    values = []
    for pid in pids:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found = [e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"OMP_NUM_THREADS=")]
        values.append(found[0] if found else "unset")
    return ",".join(values) or "?"


def summarize(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Steps per minute over the steady steps of every run (neither the first, which warms up
    and is not overlapped, nor the last, which has no next batch to wait for), and median
    phase times."""
    steady = [r for run in runs for r in run["steps"][1:-1]]
    seconds = sum(r["timing/step_s"] for r in steady)

    def med(key: str) -> float:
        return median([r[key] for r in steady if key in r])

    train_keys = ("timing/reward_s", "timing/log_probs_s", "timing/advantage_s",
                  "timing/update_s")
    return {
        "steps": float(len(steady)),
        "steps_per_min": 60.0 * len(steady) / seconds if seconds else float("nan"),
        "step_s": med("timing/step_s"),
        "rollout_s": med("timing/rollout_s"),
        "train_s": median([sum(r.get(k, 0.0) for k in train_keys) for r in steady]),
        "wait_s": med("timing/rollout_next_wait_s"),
        "sync_s": med("timing/sync_s"),
        "staleness": max((r.get("pipeline/staleness_max", r.get("async/staleness_max", 0.0))
                          for r in steady), default=0.0),
        "pause_s": med("async/push_pause_s"),
        "turns": med("rollout/turns_mean"),
        "tokens": med("rollout/sampled_tokens"),
    }


def report(raw: dict[str, Any], args: argparse.Namespace, argv: list[str], machine: str) -> str:
    lines = [
        "# Pipeline and async modes: sync vs one-step off-policy vs streaming training",
        "",
        f"Machine: {machine}.",
        "",
        f"Command: `{benchlib.command_line('bench_pipeline.py', argv)}`",
        "",
        f"configs/quickstart.yaml with the tiny model after {args.warm_start_steps} warm-start "
        f"steps, {args.batch_size} tasks x {args.group_size} samples per step, seed 0 in "
        f"every run; {args.steps} steps per run, {args.rounds} run(s) per mode taken in turn; "
        "steps per minute over steps 2 .. N-1 of all runs, phase times are medians. `rollout` is "
        "the time the driver waited for its batch (in pipeline mode only the part that did not "
        "overlap: ~0 after step 1), `train` is reward + log-probs + advantage + update, `wait` "
        "is how long the pipeline's update waited for the next batch before the sync; in async "
        f"mode (trainer.max_staleness={args.max_staleness}) `rollout` is the wait for a batch "
        "to form and `pause` how long a weight push held the engine's generation.",
        "",
    ]
    for workload in args.workloads:
        summaries = {m: summarize([r for r in raw["runs"]
                                   if r["mode"] == m and r["workload"] == workload])
                     for m in args.modes}
        base = summaries.get("sync", {}).get("steps_per_min", float("nan"))
        rows = []
        for m in args.modes:
            s = summaries[m]
            rows.append((m, s["steps_per_min"], f"{s['steps_per_min'] / base:.2f}x",
                         s["step_s"], s["rollout_s"], s["train_s"], s["wait_s"], s["sync_s"],
                         s["pause_s"], s["staleness"], s["turns"], int(s["steps"])))
        threads = "; ".join(f"{r['mode']}: " + ", ".join(
            f"{role} {t}" for role, t in r["threads"].items())
            for r in {r["mode"]: r for r in raw["runs"] if r["workload"] == workload}.values())
        title = {"cpu": "tools answer at once (rollout and update both compute)",
                 "io": f"every turn waits {args.tool_latency:g} s on its tools",
                 "lognormal": f"every tool call waits a log-normal time (mean "
                              f"{args.lognormal_mean:g} s, sigma {args.lognormal_sigma:g})",
                 }[workload]
        lines += [f"## Workload `{workload}`: {title}", "",
                  md_table(["mode", "steps/min", "vs sync", "step (s)", "rollout (s)",
                            "train (s)", "wait (s)", "sync (s)", "pause (s)",
                            "staleness max", "turns", "steps"], rows),
                  "", f"OMP_NUM_THREADS per worker process: {threads}.", ""]
    lines += [
        "## Reading",
        "",
        "Both pools share the same 2 cores here, so the pipeline can only hide rollout time "
        "that does not compute: tool waits (`io`) overlap with the update almost for free, "
        "while vLLM's decoding competes with torch for the cores (`cpu`), and torch's parallel "
        "regions wait for the thread that shares a core with vLLM's pinned thread; one actor "
        "thread (`pipeline-1t`) leaves vLLM a core of its own. With one device per pool (GPUs) "
        "the step becomes max(rollout, update) + sync. The cores are shared with other jobs: "
        "compare ratios of runs taken in turn, and expect them to move between runs.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    plan = [(w, m) for w in args.workloads for _ in range(args.rounds) for m in args.modes]
    if args.dry_run:
        print(f"pipeline plan: {len(plan)} runs of {args.steps} steps "
              f"({', '.join(f'{w}/{m}' for w, m in plan)}) -> {args.output}")
        for m in args.modes:
            print(f"{m}: configs/quickstart.yaml + "
                  + " ".join(overrides(args, Path("out"), m, "io", Path("model"))))
        return 0
    benchlib.set_bench_env()
    machine = benchlib.machine_label()
    model = benchlib.warm_started_calculator_model(args.warm_start_steps)
    register_slow_calculator()
    raw: dict[str, Any] = {"runs": []}
    for workload, mode in plan:
        print(f"--- {workload} / {mode}", flush=True)
        raw["runs"].append(run_one(args, mode, workload, model))
        benchlib.save_raw("pipeline", raw)
    benchlib.write_result(args.output, report(raw, args, argv, machine))
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
