"""End-to-end GRPO step time and tool-calling rollout: toolrl against TRL's GRPOTrainer.

Both sides train the same warm-started tiny model (SFT on Calculator oracle transcripts, so it
emits real tool calls) on the same Calculator tasks in the same order, with the same reward
(1 when the submitted answer is right), group size, tasks per step, response budget, turn
limit, learning rate and number of steps:

- toolrl: `Trainer` on configs/quickstart.yaml with overrides (Ray, vLLM CPU engine running
  multi-turn episodes, FSDP2 actor, in-process weight push to the engine every step);
- TRL 1.16 GRPOTrainer with ``environment_factory`` (its tool-calling loop over
  transformers ``generate``), CPU flags (``use_cpu``, no bf16, no gradient checkpointing),
  installed into its own venv (benchmarks/.venv-trl, created on first use from
  benchmarks/peers/requirements-trl.txt).

Each side runs in its own process and the steps alternate (toolrl step 1, TRL step 1, toolrl
step 2, ...): the idle side waits on a pipe, so both see the same machine load. The first step of
each side is a warm-up and not counted. Phases are timed by each side (TRL reports them only
to trackers): rollout = episodes + reward (TRL: ``_generate_and_score_completions``), the rest
of the step = log-probs, advantages, update, weight sync.

TRL with vLLM (``use_vllm=True``) is not run: see the result file for why.

    .venv/bin/python benchmarks/bench_trl.py [--quick] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import BENCH_DIR, ROOT, Channel, md_table, median

RESULTS = benchlib.RESULTS_DIR / "trl.md"
TRL_VENV = BENCH_DIR / ".venv-trl"
TRL_REQUIREMENTS = BENCH_DIR / "peers" / "requirements-trl.txt"
TRL_WORKER = BENCH_DIR / "peers" / "trl_grpo_worker.py"
TRL_VERSION = "1.16.0"
TARGET = 0.5  # toolrl step time / TRL step time

VLLM_NOTE = (
    "TRL + vLLM (`use_vllm=True, vllm_mode=\"colocate\"`) is not measured on this machine. "
    "When these machines were set up, TRL 1.16's colocated weight sync into the vLLM CPU "
    "engine crashed with `'Parameter' object has no attribute 'weight_loader'` (vLLM's CPU "
    "backend repacks linear weights after loading, so the per-parameter `load_weights` TRL "
    "calls no longer finds its loaders; toolrl reloads through the worker's `reload_weights` "
    "instead, see toolrl/rollout/engine.py); this script does not re-try it. TRL's server "
    "mode syncs weights over NCCL, which needs a GPU. On GPU machines, TRL + vLLM is the fair "
    "peer for toolrl's vLLM rollouts.")


# --- the run's parameters --------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short run (fewer steps, smaller batch)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (configs of both sides) and exit; installs nothing")
    p.add_argument("--steps", type=int, default=6, help="measured steps per side (+1 warm-up)")
    p.add_argument("--batch-size", type=int, default=8, help="tasks per step")
    p.add_argument("--group-size", type=int, default=8, help="samples per task")
    p.add_argument("--max-turns", type=int, default=4, help="model turns per episode")
    p.add_argument("--response-budget", type=int, default=256,
                   help="response tokens per episode, sampled + tool results (TRL's "
                        "max_completion_length)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warm-start-steps", type=int, default=150,
                   help="SFT steps of the warm start (cached in models/; bench_pipeline.py "
                        "uses the same model)")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed per step")
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--from-raw", type=Path, metavar="JSON",
                   help="run nothing: rewrite the report from a run's raw results "
                        f"(saved as {benchlib.SCRATCH / 'raw' / 'trl.json'})")
    p.add_argument("--worker", choices=["toolrl"], help=argparse.SUPPRESS)
    p.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 2)
        args.batch_size = min(args.batch_size, 4)
        args.group_size = min(args.group_size, 4)
    return args


def make_spec(args: argparse.Namespace, model: str, tasks: str, out: str) -> dict[str, Any]:
    return {"model": model, "tasks": tasks, "output_dir": out, "seed": 0,
            "steps": args.steps + 1, "batch_size": args.batch_size,
            "group_size": args.group_size, "max_turns": args.max_turns,
            "max_completion_length": args.response_budget, "lr": args.lr, "temperature": 1.0}


def toolrl_overrides(spec: dict[str, Any]) -> list[str]:
    """configs/quickstart.yaml + these: the same work as the TRL side."""
    budget = spec["max_completion_length"]
    over = {
        "model.path": spec["model"], "warm_start.enabled": False,
        "data.train_file": spec["tasks"], "data.val_file": spec["tasks"],
        "data.shuffle": False, "data.batch_size": spec["batch_size"],
        "algorithm.group_size": spec["group_size"], "seed": spec["seed"],
        # The prompt budget is half of max_total_tokens: the response budget is the other half,
        # and a turn may use all of it (TRL has no per-turn cap either).
        "rollout.max_total_tokens": 2 * budget, "rollout.engine.max_model_len": 2 * budget,
        "rollout.max_tokens_per_turn": budget, "rollout.max_turns": spec["max_turns"],
        "rollout.temperature": spec["temperature"],
        "actor.lr": spec["lr"], "actor.grad_clip": 1.0,
        "actor.ppo_epochs": 1, "actor.ppo_mini_batch_size": "null",  # one update, as TRL's
        "trainer.total_steps": spec["steps"], "trainer.output_dir": spec["output_dir"],
        "trainer.trackers": "[jsonl]", "trainer.log_rollouts": 0, "trainer.export_hf": False,
        "trainer.save_every": 0, "resources.ray_num_cpus": 4,
    }
    return [f"{k}={v}" for k, v in over.items()]


# --- the toolrl side (a worker process in the project's venv) ----------------------------------
def toolrl_worker(spec_path: Path) -> int:
    benchlib.set_bench_env()
    send, receive = benchlib.worker_channel()
    trainer = None
    try:
        import torch
        import vllm

        import toolrl
        from toolrl import batch as B
        from toolrl.trainer.config import load_config
        from toolrl.trainer.trainer import Trainer

        spec = json.loads(spec_path.read_text())
        cfg = load_config(ROOT / "configs" / "quickstart.yaml", toolrl_overrides(spec))
        trainer = Trainer(cfg)
        trainer.setup()
        tokenizer_prompt = _toolrl_prompt_tokens(spec)
        send({"event": "ready", "torch_threads": benchlib.actor_threads(trainer),
              "prompt_tokens": tokenizer_prompt,
              "versions": {"toolrl": getattr(toolrl, "__version__", "dev"),
                           "vllm": vllm.__version__, "torch": torch.__version__}})
        while True:
            message = receive()
            if message.get("cmd") != "step":
                break
            start = time.perf_counter()
            metrics = trainer.train_step()
            trainer.step += 1
            step_s = time.perf_counter() - start
            rollout = metrics["timing/rollout_s"] + metrics.get("timing/reward_s", 0.0)
            episodes = B.trajectories(trainer._last_batch)
            calls = sum(len(t.results) for e in episodes for t in e.turns)
            send({"event": "step", "step": trainer.step, "step_s": step_s, "rollout_s": rollout,
                  "update_s": step_s - rollout,
                  "sampled_tokens": metrics.get("rollout/sampled_tokens", float("nan")),
                  "tool_calls_mean": calls / max(len(episodes), 1),
                  "turns_mean": metrics.get("rollout/turns_mean", float("nan")),
                  "reward_mean": metrics.get("train/reward_mean", float("nan")),
                  "phases": {k[len("timing/"):-2]: v for k, v in metrics.items()
                             if k.startswith("timing/")}})
        return 0
    except Exception as e:
        traceback.print_exc()
        send({"event": "error", "error": f"{type(e).__name__}: {e}"})
        return 1
    finally:
        if trainer is not None:
            if trainer.tracker is not None:
                trainer.tracker.close()
            trainer.close()
        from toolrl.controller import shutdown_ray

        shutdown_ray()


def _toolrl_prompt_tokens(spec: dict[str, Any]) -> int:
    """Length of the first task's prompt as toolrl renders it (a fairness check vs TRL)."""
    from transformers import AutoTokenizer

    import toolrl
    from toolrl.rollout.chat import ChatRenderer

    row = json.loads(Path(spec["tasks"]).read_text().splitlines()[0])
    env = toolrl.make_env("toolrl/Calculator-v0")
    try:
        obs, info = env.reset(seed=0, options=row)
        renderer = ChatRenderer(AutoTokenizer.from_pretrained(spec["model"]))
        return len(renderer.render_prompt(obs, info["tools"]))
    finally:
        env.close()


# --- the peer's venv ---------------------------------------------------------------------------
def trl_python() -> Path:
    return TRL_VENV / "bin" / "python"


def ensure_trl_venv() -> Path:
    """benchmarks/.venv-trl with the pinned peer (created when missing or stale)."""
    py = trl_python()
    probe = [str(py), "-c", f"import trl, sys; sys.exit(trl.__version__ != {TRL_VERSION!r})"]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return py
    print(f"creating {TRL_VENV.relative_to(ROOT)} (TRL {TRL_VERSION}, own venv) ...", flush=True)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # the CPU build, first
    subprocess.run([*pip, "-r", str(TRL_REQUIREMENTS)], check=True)
    subprocess.run(probe, check=True)
    return py


# --- the coordinator -------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    """Warm start, write the tasks, start both sides, alternate their steps; raw results."""
    from toolrl.envs.calculator import CalculatorEnv

    trl_py = ensure_trl_venv()
    t0 = time.perf_counter()
    model = benchlib.warm_started_calculator_model(args.warm_start_steps)
    warm_s = time.perf_counter() - t0
    work = Path(tempfile.mkdtemp(prefix="toolrl-bench-trl-"))
    tasks = work / "tasks.jsonl"
    rows = CalculatorEnv.make_tasks(args.batch_size * (args.steps + 1), seed=0, split="train",
                                    difficulty=1)
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sides: dict[str, Channel] = {}
    out: dict[str, Any] = {"warm_start_s": warm_s, "model": str(model.relative_to(ROOT)),
                           "steps": {"toolrl": [], "trl": []}, "ready": {}, "startup_s": {}}
    try:
        for name, cmd in (("toolrl", [sys.executable, __file__, "--worker", "toolrl"]),
                          ("trl", [str(trl_py), str(TRL_WORKER)])):
            spec = make_spec(args, str(model), str(tasks), str(work / name))
            spec_path = work / f"{name}.json"
            spec_path.write_text(json.dumps(spec))
            arg = ["--spec", str(spec_path)] if name == "toolrl" else [str(spec_path)]
            start = time.perf_counter()
            sides[name] = Channel(name, [*cmd, *arg], work / f"{name}.log",
                                  env=dict(benchlib.BENCH_ENV))
            out["ready"][name] = sides[name].receive(timeout=900)
            out["startup_s"][name] = time.perf_counter() - start
            print(f"{name} ready after {out['startup_s'][name]:.0f} s", flush=True)
        for step in range(args.steps + 1):
            for name, side in sides.items():
                side.send({"cmd": "step"})
                result = side.receive(timeout=args.timeout)
                out["steps"][name].append(result)
                print(f"step {step} {name}: {result['step_s']:.2f} s "
                      f"(rollout {result['rollout_s']:.2f} s, "
                      f"{result['sampled_tokens']:.0f} tokens)", flush=True)
    finally:
        for side in sides.values():
            side.close()
    out["work_dir"] = str(work)
    return out


def summarize(raw: dict[str, Any], args: argparse.Namespace, argv: list[str]) -> str:
    """The markdown report of a run's raw results."""
    def stat(name: str, key: str) -> float:
        return median([s[key] for s in raw["steps"][name][1:]])

    def rate(name: str) -> float:
        steps = raw["steps"][name][1:]
        return sum(s["sampled_tokens"] for s in steps) / sum(s["rollout_s"] for s in steps)

    ready = raw["ready"]
    versions = {**ready["trl"]["versions"], **ready["toolrl"]["versions"]}
    step_ratio = stat("toolrl", "step_s") / stat("trl", "step_s")
    rollout_ratio = stat("toolrl", "rollout_s") / stat("trl", "rollout_s")
    update_ratio = stat("toolrl", "update_s") / stat("trl", "update_s")
    tok_ratio = rate("toolrl") / rate("trl")
    rows = []
    for key, label in (("step_s", "GRPO step (s)"), ("rollout_s", "rollout + reward (s)"),
                       ("update_s", "rest of the step: log-probs, update, sync (s)"),
                       ("sampled_tokens", "sampled tokens per step"),
                       ("tool_calls_mean", "tool calls per episode"),
                       ("reward_mean", "reward (success) mean")):
        a, b = stat("toolrl", key), stat("trl", key)
        ratio = f"{a / b:.2f}x" if key.endswith("_s") and b else ""
        rows.append((label, a, b, ratio))
    rows.append(("rollout output tok/s", rate("toolrl"), rate("trl"), f"{tok_ratio:.2f}x"))
    verdict = "met" if step_ratio <= TARGET else "NOT met"
    phases = raw["steps"]["toolrl"][1:]
    phase_names = list(phases[0].get("phases", {})) if phases else []
    built = (f"built in {raw['warm_start_s']:.0f} s" if raw["warm_start_s"] > 5
             else "reused from models/")
    medians_by_phase = {k: median([p["phases"][k] for p in phases]) for k in phase_names}
    top = max(medians_by_phase, key=medians_by_phase.get) if medians_by_phase else "?"
    top_share = medians_by_phase.get(top, 0.0) / stat("toolrl", "step_s")
    phase_row = ", ".join(f"{k} {median([p['phases'][k] for p in phases]):.2f} s"
                          for k in phase_names)
    lines = [
        "# End-to-end GRPO step: toolrl vs TRL GRPOTrainer",
        "",
        f"Machine: {raw['machine']}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "",
        f"Command: `{benchlib.command_line('bench_trl.py', argv)}`",
        "",
        f"Work per step, both sides: {args.batch_size} Calculator tasks (difficulty 1) x "
        f"{args.group_size} samples, at most {args.max_turns} model turns and "
        f"{args.response_budget} response tokens per episode (sampled + tool results), "
        f"temperature 1, lr {args.lr:g}, no KL, reward = success; the same tasks in the same "
        f"order. Model: the tiny Qwen2 (small) after {args.warm_start_steps} SFT steps on oracle "
        f"transcripts (`{raw['model']}`, {built}), so both sides run real tool episodes. "
        f"Prompt of the first task: {ready['toolrl']['prompt_tokens']} "
        f"tokens in toolrl, {ready['trl']['prompt_tokens']} in TRL. torch threads: "
        f"{ready['toolrl']['torch_threads']} in toolrl's actor process (Ray sets "
        f"OMP_NUM_THREADS to `resources.cpus_per_process`, 2 in configs/quickstart.yaml), "
        f"{ready['trl']['torch_threads']} in TRL's process.",
        "",
        f"Steps alternate between the two processes; medians of {args.steps} steps after one "
        f"warm-up step each. Start-up (not in the step times): toolrl "
        f"{raw['startup_s']['toolrl']:.0f} s (Ray, vLLM engine, FSDP actor), TRL "
        f"{raw['startup_s']['trl']:.0f} s.",
        "",
        md_table(["measurement (median per step)", "toolrl", f"TRL {versions.get('trl', '')}",
                  "toolrl / TRL"], rows),
        "",
        f"**toolrl step time / TRL step time = {step_ratio:.2f}x** (target <= {TARGET}x: "
        f"{verdict}); rollout {rollout_ratio:.2f}x, rest of the step {update_ratio:.2f}x, "
        f"rollout tok/s {tok_ratio:.2f}x.",
        "",
        f"toolrl's step by phase (median): {phase_row}. Its largest phase is `{top}` "
        f"({top_share:.0%} of the step).",
        "",
        "Where the time goes: TRL generates each turn with transformers `generate` over the "
        "whole padded batch (every sample waits for the longest one of its turn, and samples "
        "that stopped calling tools still wait for the batch), and its tool loop cannot end "
        "an episode when `submit` is called, so it samples one more turn after the answer "
        "(more sampled tokens per step). toolrl runs the episodes concurrently on the vLLM "
        "engine (continuous batching, prefix cache) and ends them on `submit`, but pays for "
        "an extra forward pass (`old_log_probs`, also with one PPO epoch) and a weight push "
        "into the engine every step.",
        "",
        VLLM_NOTE,
        "",
    ]
    return "\n".join(lines)


def plot(raw: dict[str, Any]) -> Path:
    """Stacked bars: median rollout and rest-of-step time per side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["toolrl", "trl"]
    roll = [median([s["rollout_s"] for s in raw["steps"][n][1:]]) for n in names]
    rest = [median([s["update_s"] for s in raw["steps"][n][1:]]) for n in names]
    fig, ax = plt.subplots(figsize=(4.5, 3.4))
    labels = ["toolrl", "TRL GRPOTrainer"]
    ax.bar(labels, roll, label="rollout + reward")
    ax.bar(labels, rest, bottom=roll, label="log-probs, update, sync")
    ax.set_ylabel("seconds per GRPO step (median)")
    ax.set_title("same work, same machine, alternating steps")
    ax.legend(fontsize=8)
    path = benchlib.save_plot(fig, "trl_step")
    plt.close(fig)
    return path


def dry_run_plan(args: argparse.Namespace) -> str:
    spec = make_spec(args, "models/bench-calculator-warm-N", "tasks.jsonl", "out")
    return "\n".join([
        "bench_trl plan (dry run: nothing installed or started)",
        f"  TRL venv: {TRL_VENV.relative_to(ROOT)} from "
        f"{TRL_REQUIREMENTS.relative_to(ROOT)} (exists: {trl_python().exists()})",
        f"  spec: {json.dumps(spec)}",
        "  toolrl: toolrl train --config configs/quickstart.yaml "
        + " ".join(toolrl_overrides(spec)),
    ])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker == "toolrl":
        return toolrl_worker(args.spec)
    if args.dry_run:
        print(dry_run_plan(args))
        return 0
    if args.from_raw:
        raw = json.loads(args.from_raw.read_text())
        args = parse_args(raw.get("argv", []))
        plot(raw)
        benchlib.write_result(RESULTS, summarize(raw, args, raw.get("argv", [])))
        return 0
    benchlib.set_bench_env()
    machine = benchlib.machine_label()
    raw = run(args)
    raw["machine"] = machine
    raw["argv"] = argv
    benchlib.save_raw("trl", raw)
    plot(raw)
    benchlib.write_result(args.output, summarize(raw, args, argv))
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
