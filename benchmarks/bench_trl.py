"""End-to-end GRPO step time and tool-calling rollout: toolrl against TRL's GRPOTrainer.

Two workloads (``--workload``): ``calculator`` (the default, below) and ``real_fc``, SmolLM2-135M
on real function-calling rows (see `real_fc_overrides` and the result file
benchmarks/results/trl_real_fc.md).

calculator: both sides train the same warm-started tiny model (SFT on Calculator oracle
transcripts, so it emits real tool calls) on the same Calculator tasks in the same order, with
the same reward (1 when the submitted answer is right), group size, tasks per step, response
budget, turn limit, learning rate and number of steps:

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

real_fc: both sides train SmolLM2-135M-Instruct (``--model``; the recipe's warm start
outputs/real_fc/warm_start emits calls) on the same FunctionCalling rows (``--rows``, the first
ones whose prompt fits configs/real_fc.yaml's prompt budget, same order), one turn each, with
the reward ``bfcl_ast`` + 0.1 ``format`` (`REAL_FC_REWARD`), group size, tasks per step,
completion budget, temperature and micro-batch; lr constant on both sides:

- toolrl: configs/real_fc.yaml with the overrides of `real_fc_overrides`;
- TRL: each row's prompt as text, rendered here by the model's own chat template with the row's
  tools (toolrl's exact prompt tokens; the worker checks every row's ids). TRL 1.16 takes tools
  only as Python callables, one list per trainer or per ``environment_factory`` environment,
  whose schemas transformers derives from signatures and docstrings (a row's JSON schema, with
  its enums and nested types, cannot be passed), and giving TRL tools turns on its
  tool-execution loop, while this episode is one turn. The reward function re-states toolrl's
  score over toolrl's own parser and BFCL checker (imported from the source tree; equality with
  toolrl's reward: tests/benchmarks/test_bench_trl_real_fc.py, and checked per row by
  ``--dry-run``).

    .venv/bin/python benchmarks/bench_trl.py [--quick] [--dry-run]
    .venv/bin/python benchmarks/bench_trl.py --workload real_fc [--dry-run]
        [--model outputs/real_fc/warm_start] [--rows data/real_fc/nestful_train.jsonl]
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
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import BENCH_DIR, ROOT, Channel, md_table, median

RESULTS = benchlib.RESULTS_DIR / "trl.md"
REAL_FC_RESULTS = benchlib.RESULTS_DIR / "trl_real_fc.md"
REAL_FC_CONFIG = ROOT / "configs" / "real_fc.yaml"
REAL_FC_MODEL = ROOT / "models" / "smollm2-135m-instruct"
REAL_FC_ROWS = ROOT / "data" / "real_fc" / "nestful_train.jsonl"
# The work per step of each workload (flags left unset take these): calculator's as before,
# real_fc's those of configs/real_fc.yaml (lr: its actor.lr, constant here on both sides).
WORKLOADS: dict[str, dict[str, Any]] = {
    "calculator": {"steps": 6, "batch_size": 8, "group_size": 8, "response_budget": 256,
                   "lr": 3e-4},
    "real_fc": {"steps": 2, "batch_size": 8, "group_size": 8, "response_budget": 160,
                "lr": 2e-6, "micro_batch_size": 4},
}
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
    p.add_argument("--workload", choices=list(WORKLOADS), default="calculator",
                   help="calculator: the tiny model on Calculator episodes; real_fc: SmolLM2 on "
                        "FunctionCalling rows (configs/real_fc.yaml's work)")
    p.add_argument("--quick", action="store_true", help="a short run (fewer steps, smaller batch)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (configs of both sides) and exit; installs nothing. "
                        "real_fc: also validates the model, the rows, both configs and (when "
                        "TRL's venv exists) the TRL side's prompts and scores, without training")
    p.add_argument("--steps", type=int, help="measured steps per side (+1 warm-up; "
                   "calculator 6, real_fc 2: a TRL step of its 64 samples takes ~15 min)")
    p.add_argument("--batch-size", type=int, help="tasks per step (8: the configs')")
    p.add_argument("--group-size", type=int, help="samples per task (8: the configs')")
    p.add_argument("--max-turns", type=int, default=4,
                   help="model turns per episode (calculator; real_fc is one turn)")
    p.add_argument("--response-budget", type=int,
                   help="response tokens per episode, sampled + tool results (TRL's "
                        "max_completion_length; calculator 256, real_fc 160)")
    p.add_argument("--lr", type=float, help="learning rate (calculator 3e-4, real_fc 2e-6)")
    p.add_argument("--model", type=Path, default=REAL_FC_MODEL,
                   help="real_fc: the model both sides train (fetched when it is the default "
                        "and missing; outputs/real_fc/warm_start is the recipe's warm start)")
    p.add_argument("--rows", type=Path, default=REAL_FC_ROWS,
                   help="real_fc: toolrl FunctionCalling rows (JSONL); the first ones whose "
                        "prompt fits the config's prompt budget are used, in order")
    p.add_argument("--micro-batch-size", type=int,
                   help="real_fc: sequences per forward/backward on both sides (toolrl "
                        "actor.micro_batch_size, TRL per_device_train_batch_size with "
                        "gradient accumulation over the step's batch; default 4)")
    p.add_argument("--warm-start-steps", type=int, default=150,
                   help="SFT steps of the warm start (cached in models/; bench_pipeline.py "
                        "uses the same model)")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed per step")
    p.add_argument("--output", type=Path,
                   help=f"the report (default {RESULTS.relative_to(ROOT)}, real_fc "
                        f"{REAL_FC_RESULTS.relative_to(ROOT)})")
    p.add_argument("--from-raw", type=Path, metavar="JSON",
                   help="run nothing: rewrite the report from a run's raw results "
                        f"(saved as {benchlib.SCRATCH / 'raw' / 'trl.json'}, real_fc "
                        "trl_real_fc.json)")
    p.add_argument("--worker", choices=["toolrl"], help=argparse.SUPPRESS)
    p.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for key, value in WORKLOADS[args.workload].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.output is None:
        args.output = REAL_FC_RESULTS if args.workload == "real_fc" else RESULTS
    if args.quick:
        args.steps = min(args.steps, 2)
        args.batch_size = min(args.batch_size, 4)
        args.group_size = min(args.group_size, 4)
    if args.workload == "real_fc":
        args.max_turns = 1
        if (args.batch_size * args.group_size) % args.micro_batch_size:
            p.error(f"--micro-batch-size {args.micro_batch_size} must divide the step's "
                    f"{args.batch_size} x {args.group_size} samples")
    return args


def make_spec(args: argparse.Namespace, model: str, tasks: str, out: str) -> dict[str, Any]:
    spec = {"model": model, "tasks": tasks, "output_dir": out, "seed": 0,
            "steps": args.steps + 1, "batch_size": args.batch_size,
            "group_size": args.group_size, "max_turns": args.max_turns,
            "max_completion_length": args.response_budget, "lr": args.lr, "temperature": 1.0}
    if args.workload == "real_fc":
        spec.update(workload="real_fc", micro_batch_size=args.micro_batch_size,
                    reward_weights=real_fc_reward_weights())
    return spec


def toolrl_config(spec: dict[str, Any]) -> Path:
    """The config file the toolrl side starts from."""
    if spec.get("workload") == "real_fc":
        return REAL_FC_CONFIG
    return ROOT / "configs" / "quickstart.yaml"


def toolrl_overrides(spec: dict[str, Any]) -> list[str]:
    """`toolrl_config(spec)` + these: the same work as the TRL side."""
    if spec.get("workload") == "real_fc":
        return real_fc_overrides(spec)
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


def _real_fc_yaml() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(REAL_FC_CONFIG.read_text())


# The reward of the real_fc comparison: BFCL's verdict plus a tenth for well-formed calls (the
# recipe's reward when it was measured; the TRL side re-states exactly this weighted sum of
# ``bfcl_ast`` and ``format`` with their defaults, so it is pinned here, not read from the
# config, whose reward the recipe may change).
REAL_FC_REWARD = {"bfcl_ast": 1.0, "format": 0.1}


def real_fc_reward_weights() -> dict[str, float]:
    """The real_fc comparison's reward as {name: weight} (`REAL_FC_REWARD`)."""
    return dict(REAL_FC_REWARD)


def real_fc_reward_override() -> str:
    """``reward.rewards=...``: the toolrl side's reward, `REAL_FC_REWARD` as a config value."""
    terms = ", ".join(f"{{name: {k}, weight: {w}}}" for k, w in REAL_FC_REWARD.items())
    return f"reward.rewards=[{terms}]"


def real_fc_overrides(spec: dict[str, Any]) -> list[str]:
    """configs/real_fc.yaml + these: the same work as the TRL side (its model and rows, no warm
    start, a constant lr as TRL's, one update per step, the step's budgets)."""
    budget = spec["max_completion_length"]
    rollout = _real_fc_yaml()["rollout"]
    prompt = int(rollout["max_prompt_tokens"])
    total = prompt + budget  # the response budget is exactly the completion budget
    over = {
        "model.path": spec["model"], "warm_start.enabled": False,
        "data.train_file": spec["tasks"], "data.val_file": spec["tasks"],
        "data.shuffle": False, "data.batch_size": spec["batch_size"],
        # the rows were chosen to fit the prompt budget (see `prepare_real_fc`): none dropped
        "data.overlong_prompts": "refuse",
        "algorithm.group_size": spec["group_size"], "seed": spec["seed"],
        "rollout.max_tokens_per_turn": budget, "rollout.max_total_tokens": total,
        "rollout.engine.max_model_len": max(int(rollout["engine"]["max_model_len"]), total),
        "rollout.temperature": spec["temperature"],
        "actor.lr": spec["lr"], "actor.lr_schedule": "constant", "actor.warmup_steps": 0,
        "actor.micro_batch_size": spec["micro_batch_size"], "actor.grad_clip": 1.0,
        "actor.ppo_epochs": 1, "actor.ppo_mini_batch_size": "null",  # one update, as TRL's
        "trainer.total_steps": spec["steps"], "trainer.output_dir": spec["output_dir"],
        "trainer.trackers": "[jsonl]", "trainer.log_rollouts": 0, "trainer.export_hf": False,
        "trainer.save_every": 0, "trainer.val_every": 0, "resources.ray_num_cpus": 4,
        "algorithm.filter_groups": False,  # every group is trained on, as TRL's
    }
    return [f"{k}={v}" for k, v in over.items()] + [real_fc_reward_override()]


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
        real_fc = spec.get("workload") == "real_fc"
        cfg = load_config(toolrl_config(spec), toolrl_overrides(spec))
        trainer = Trainer(cfg)
        trainer.setup()
        # real_fc: the coordinator rendered every row's prompt with toolrl (prepare_real_fc)
        tokenizer_prompt = None if real_fc else _toolrl_prompt_tokens(spec)
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
            # calculator: calls that ran; real_fc (nothing runs): calls parsed, as TRL's side
            calls = sum(len(t.parse.calls) if real_fc else len(t.results)
                        for e in episodes for t in e.turns)
            send({"event": "step", "step": trainer.step, "step_s": step_s, "rollout_s": rollout,
                  "update_s": step_s - rollout,
                  "sampled_tokens": metrics.get("rollout/sampled_tokens", float("nan")),
                  "tool_calls_mean": calls / max(len(episodes), 1),
                  "turns_mean": metrics.get("rollout/turns_mean", float("nan")),
                  "reward_mean": metrics.get("train/reward_mean", float("nan")),
                  **({"success_mean": metrics.get("reward/bfcl_ast", float("nan"))}
                     if real_fc else {}),
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
    # lazy_loader: toolrl's package imports, for the real_fc scorer (toolrl.core.parse, bfcl)
    probe = [str(py), "-c", "import lazy_loader, trl, sys; "
             f"sys.exit(trl.__version__ != {TRL_VERSION!r})"]
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


# --- real_fc: the model and the rows ------------------------------------------------------------
def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def real_fc_model(args: argparse.Namespace, fetch: bool = True) -> Path | None:
    """``--model`` as an absolute path; the default one is fetched when missing (``make
    smollm2`` does the same) unless ``fetch`` is False (then None when missing)."""
    model = args.model if args.model.is_absolute() else ROOT / args.model
    if (model / "config.json").exists():
        return model
    if not fetch:
        return None
    if model.resolve() != REAL_FC_MODEL.resolve():
        raise SystemExit(f"--model {args.model}: no checkpoint there (no config.json)")
    from toolrl.models.gguf import fetch_model

    fetch_model("smollm2-135m-instruct", model)
    return model


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def real_fc_task(env: Any, info: dict[str, Any]) -> dict[str, Any]:
    """What the TRL side's scorer needs of a FunctionCalling episode just reset: the row as the
    env holds it (normalized), the episode's tool schemas, the call format, strict parsing."""
    import copy

    base = env.unwrapped
    return {"row": copy.deepcopy(base.row), "tools": info.get("tools") or [],
            "format": info["format"], "strict_parse": base.strict_parse}


def toolrl_real_fc_score(env: Any, row: dict[str, Any], text: str, reward: Any,
                         seed: int) -> float:
    """toolrl's reward of ``text`` as the one turn of ``row``'s episode: the env plays it
    (`toolrl.run_episode`), ``reward`` (a `ComposedReward`) scores the trajectory."""
    import asyncio
    import copy

    from toolrl.core.env import run_episode

    traj = asyncio.run(run_episode(env, lambda _env, _messages: text, row=copy.deepcopy(row),
                                   seed=seed))
    return reward.score([traj]).scores[0]


def prepare_real_fc(args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    """The step's rows, as toolrl sees them: the first ``--rows`` rows whose first prompt
    (messages and tools through the model's chat template, as toolrl's preflight renders it)
    fits configs/real_fc.yaml's prompt budget, in file order. Writes the toolrl side's rows
    (``toolrl.jsonl``) and the TRL side's (``trl.jsonl``: per row the prompt text, toolrl's
    prompt token ids, what the scorer needs, and reference completions with toolrl's reward
    of each: the gold calls and a prose answer). Returns the files and the rows' numbers."""
    import copy

    from transformers import AutoTokenizer

    from toolrl.core.registration import make_env, row_env
    from toolrl.data import load_rows
    from toolrl.reward import build_reward
    from toolrl.rollout.chat import ChatRenderer
    from toolrl.trainer.config import load_config

    spec = make_spec(args, str(model), str(work / "toolrl.jsonl"), str(work / "out"))
    cfg = load_config(REAL_FC_CONFIG, real_fc_overrides(spec))
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(model), check=False,
                            chat_template_kwargs=cfg.rollout.chat_template_kwargs)
    reward = build_reward(cfg.reward)
    limit, need = cfg.rollout.max_prompt_len, args.batch_size * (args.steps + 1)
    chosen: list[dict[str, Any]] = []
    prepared: list[dict[str, Any]] = []
    over = 0
    envs: dict[str, Any] = {}
    try:
        for row in load_rows(args.rows):
            env_id, kwargs = row_env(row, cfg.env.id, cfg.env.kwargs)
            if env_id != "toolrl/FunctionCalling-v0" or kwargs.get("tool_format") or \
                    set(kwargs) - {"strict_parse"}:
                raise SystemExit(f"{args.rows}: row {row.get('id')!r} is not a plain "
                                 f"toolrl/FunctionCalling-v0 row ({env_id}, {kwargs}); the TRL "
                                 "side re-states only that env's one-turn scoring")
            key = json.dumps(kwargs, sort_keys=True)
            env = envs[key] = envs.get(key) or make_env(env_id, **kwargs)
            messages, info = env.reset(seed=cfg.seed, options=copy.deepcopy(row))
            ids = renderer.render_prompt(messages, info.get("tools"))
            if len(ids) > limit:
                over += 1
                continue
            task = real_fc_task(env, info)
            references = {}
            for name, text in (("gold", env.unwrapped.oracle_action()),
                               ("prose", "None of these functions can help with that.")):
                references[name] = {"text": text, "toolrl": toolrl_real_fc_score(
                    env, row, text, reward, cfg.seed)}
            chosen.append(row)
            prepared.append({"id": row.get("id"), "prompt": renderer.render_text(
                messages, info.get("tools"), add_generation_prompt=True), "prompt_ids": ids,
                "task": task, "references": references})
            if len(chosen) == need:
                break
    finally:
        reward.close()
        for env in envs.values():
            env.close()
    if len(chosen) < need:
        raise SystemExit(f"{args.rows}: {len(chosen)} rows fit the prompt budget ({limit} "
                         f"tokens; {over} longer), the run needs {need} (batch size x steps)")
    lengths = [len(r["prompt_ids"]) for r in prepared]
    gold = [r["references"]["gold"]["toolrl"] for r in prepared]
    return {"toolrl_file": str(_write_jsonl(work / "toolrl.jsonl", chosen)),
            "trl_file": str(_write_jsonl(work / "trl.jsonl", prepared)),
            "file": _rel(args.rows), "rows": len(chosen), "skipped_over_budget": over,
            "prompt_budget": limit, "prompt_tokens_min": min(lengths),
            "prompt_tokens_median": median(lengths), "prompt_tokens_max": max(lengths),
            "categories": sorted({r["task"]["row"].get("category", "?") for r in prepared}),
            "gold_score_min": min(gold)}


# --- the coordinator -------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    """Warm start (calculator) or the model and rows (real_fc), start both sides, alternate
    their steps; raw results."""
    trl_py = ensure_trl_venv()
    work = Path(tempfile.mkdtemp(prefix="toolrl-bench-trl-"))
    t0 = time.perf_counter()
    extra: dict[str, Any] = {}
    if args.workload == "real_fc":
        model = real_fc_model(args)
        extra["model_s"] = time.perf_counter() - t0
        prep = prepare_real_fc(args, model, work)
        tasks = {"toolrl": prep.pop("toolrl_file"), "trl": prep.pop("trl_file")}
        extra["rows"] = prep
        print(f"rows: {prep['rows']} of {prep['file']} (prompts {prep['prompt_tokens_min']}.."
              f"{prep['prompt_tokens_max']} tokens)", flush=True)
    else:
        from toolrl.envs.calculator import CalculatorEnv

        model = benchlib.warm_started_calculator_model(args.warm_start_steps)
        extra["warm_start_s"] = time.perf_counter() - t0
        rows = CalculatorEnv.make_tasks(args.batch_size * (args.steps + 1), seed=0,
                                        split="train", difficulty=1)
        path = str(_write_jsonl(work / "tasks.jsonl", rows))
        tasks = {"toolrl": path, "trl": path}
    sides: dict[str, Channel] = {}
    out: dict[str, Any] = {**extra, "model": _rel(model),
                           "steps": {"toolrl": [], "trl": []}, "ready": {}, "startup_s": {}}
    try:
        for name, cmd in (("toolrl", [sys.executable, __file__, "--worker", "toolrl"]),
                          ("trl", [str(trl_py), str(TRL_WORKER)])):
            spec = make_spec(args, str(model), tasks[name], str(work / name))
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


COMMON_MEASURES = (("step_s", "GRPO step (s)"), ("rollout_s", "rollout + reward (s)"),
                   ("update_s", "rest of the step: log-probs, update, sync (s)"),
                   ("sampled_tokens", "sampled tokens per step"))


def compare(raw: dict[str, Any], measures: tuple[tuple[str, str], ...]) -> SimpleNamespace:
    """What both workloads' reports share: per-step medians of both sides (warm-up dropped),
    the lines of how they were taken and the table (``COMMON_MEASURES`` + ``measures`` +
    rollout tok/s), the time ratios, the verdict, the versions and toolrl's phases."""
    def stat(name: str, key: str) -> float:
        return median([s.get(key, float("nan")) for s in raw["steps"][name][1:]])

    def rate(name: str) -> float:
        steps = raw["steps"][name][1:]
        return sum(s["sampled_tokens"] for s in steps) / sum(s["rollout_s"] for s in steps)

    ready = raw["ready"]
    versions = {**ready["trl"]["versions"], **ready["toolrl"]["versions"]}
    ratio = {k: stat("toolrl", k) / stat("trl", k) for k in ("step_s", "rollout_s", "update_s")}
    tok_ratio = rate("toolrl") / rate("trl")
    table = []
    for key, label in (*COMMON_MEASURES, *measures):
        a, b = stat("toolrl", key), stat("trl", key)
        table.append((label, a, b, f"{a / b:.2f}x" if key.endswith("_s") and b else ""))
    table.append(("rollout output tok/s", rate("toolrl"), rate("trl"), f"{tok_ratio:.2f}x"))
    phases = raw["steps"]["toolrl"][1:]
    by_phase = {k: median([p["phases"][k] for p in phases])
                for k in (phases[0].get("phases", {}) if phases else {})}
    top = max(by_phase, key=by_phase.get) if by_phase else "?"
    phase_line = ("toolrl's step by phase (median): "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in by_phase.items())
                  + f". Its largest phase is `{top}`"
                  + (f" ({by_phase[top] / stat('toolrl', 'step_s'):.0%} of the step)."
                     if by_phase else "."))
    timing = [f"Steps alternate between the two processes; medians of {len(phases)} steps "
              f"after one warm-up step each. Start-up (not in the step times): toolrl "
              f"{raw['startup_s']['toolrl']:.0f} s (Ray, vLLM engine, FSDP actor), TRL "
              f"{raw['startup_s']['trl']:.0f} s.", "",
              md_table(["measurement (median per step)", "toolrl",
                        f"TRL {versions.get('trl', '')}", "toolrl / TRL"], table)]
    return SimpleNamespace(versions=versions, ratio=ratio, tok_ratio=tok_ratio, timing=timing,
                           verdict="met" if ratio["step_s"] <= TARGET else "NOT met",
                           phase_line=phase_line)


def report_head(title: str, raw: dict[str, Any], versions: dict[str, str],
                argv: list[str]) -> list[str]:
    """The title, machine, versions and command lines of a report."""
    return [title, "", f"Machine: {raw['machine']}. Versions: "
            + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".", "",
            f"Command: `{benchlib.command_line('bench_trl.py', argv)}`", ""]


def summarize(raw: dict[str, Any], args: argparse.Namespace, argv: list[str]) -> str:
    """The markdown report of a run's raw results."""
    if args.workload == "real_fc":
        return summarize_real_fc(raw, args, argv)
    c = compare(raw, (("tool_calls_mean", "tool calls per episode"),
                      ("reward_mean", "reward (success) mean")))
    ready = raw["ready"]
    built = (f"built in {raw['warm_start_s']:.0f} s" if raw["warm_start_s"] > 5
             else "reused from models/")
    lines = [
        *report_head("# End-to-end GRPO step: toolrl vs TRL GRPOTrainer", raw, c.versions, argv),
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
        *c.timing,
        "",
        f"**toolrl step time / TRL step time = {c.ratio['step_s']:.2f}x** (target <= "
        f"{TARGET}x: {c.verdict}); rollout {c.ratio['rollout_s']:.2f}x, rest of the step "
        f"{c.ratio['update_s']:.2f}x, rollout tok/s {c.tok_ratio:.2f}x.",
        "",
        c.phase_line,
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


def summarize_real_fc(raw: dict[str, Any], args: argparse.Namespace, argv: list[str]) -> str:
    """The markdown report of a real_fc run's raw results."""
    c = compare(raw, (("tool_calls_mean", "calls per completion (parsed)"),
                      ("success_mean", "bfcl_ast mean"),
                      ("reward_mean", "reward mean (bfcl_ast + 0.1 format)")))
    ready, rows_info = raw["ready"], raw["rows"]
    weights = real_fc_reward_weights()
    n = args.batch_size * args.group_size
    lines = [
        *report_head("# End-to-end GRPO step on SmolLM2-135M (function calling): toolrl vs TRL "
                     "GRPOTrainer", raw, c.versions, argv),
        f"Work per step, both sides: {args.batch_size} rows of `{rows_info['file']}` x "
        f"{args.group_size} samples ({n} completions), one turn of at most "
        f"{args.response_budget} tokens, temperature 1, lr {args.lr:g} (constant), no KL, one "
        f"update in micro-batches of {args.micro_batch_size} sequences; reward = "
        f"{weights['bfcl_ast']:g} x `bfcl_ast` + {weights['format']:g} x `format` "
        f"(configs/real_fc.yaml's). Model: `{raw['model']}`. Rows: the first "
        f"{rows_info['rows']} whose prompt fits the config's {rows_info['prompt_budget']}-token "
        f"prompt budget ({rows_info['skipped_over_budget']} longer ones skipped), in file "
        f"order, the same on both sides; categories {', '.join(rows_info['categories'])}; "
        f"prompts {rows_info['prompt_tokens_min']}..{rows_info['prompt_tokens_max']} tokens "
        f"(median {rows_info['prompt_tokens_median']:.0f}), the same token ids on both sides "
        "(checked per row). torch threads: "
        f"{ready['toolrl']['torch_threads']} in toolrl's actor process, "
        f"{ready['trl']['torch_threads']} in TRL's process.",
        "",
        "toolrl runs configs/real_fc.yaml (vLLM CPU engine, FSDP2 actor, a weight push into the "
        "engine every step) with `real_fc_overrides`. TRL gets each prompt as text rendered by "
        "the model's chat template with the row's tools: TRL 1.16 takes tools only as Python "
        "callables (one list per trainer or per environment, schemas derived from signatures "
        "and docstrings), not a row's JSON schemas, and with tools it runs its tool-execution "
        "loop, while this episode is one turn. Its reward function re-states toolrl's score "
        "over toolrl's own hermes parser and BFCL checker; before training every row's gold "
        "calls and a prose answer score the same on both sides (and "
        "tests/benchmarks/test_bench_trl_real_fc.py checks the equality on more completions).",
        "",
        *c.timing,
        "",
        f"**SmolLM2-135M function calling: toolrl step time / TRL step time = "
        f"{c.ratio['step_s']:.2f}x** (target <= {TARGET}x: {c.verdict}); rollout "
        f"{c.ratio['rollout_s']:.2f}x, rest of the step {c.ratio['update_s']:.2f}x, rollout "
        f"tok/s {c.tok_ratio:.2f}x.",
        "",
        c.phase_line,
        "",
        "TRL samples with transformers `generate` over the whole left-padded batch of "
        f"{n} prompts (every completion waits for the longest); toolrl samples on the vLLM "
        "engine (continuous batching, the group's shared prompt prefix-cached) and pays for a "
        "weight push into the engine every step.",
        "",
        VLLM_NOTE,
        "",
    ]
    return "\n".join(lines)


def plot(raw: dict[str, Any], name: str = "trl_step") -> Path:
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
    path = benchlib.save_plot(fig, name)
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


def dry_run_real_fc(args: argparse.Namespace) -> int:
    """The real_fc plan, then the checks a run starts with, without training: the model and
    rows exist, toolrl's config loads and its preflight accepts the chosen rows (the check its
    trainer runs), and, when TRL's venv exists, the TRL worker's per-row checks (prompt ids,
    reference scores) and its GRPOConfig. Installs and fetches nothing; 1 on a problem."""
    from toolrl.trainer.config import load_config

    model = real_fc_model(args, fetch=False)
    spec = make_spec(args, str(model or args.model), "rows.jsonl", "out")
    print("bench_trl plan, real_fc (dry run: nothing installed, fetched or trained)")
    print(f"  TRL venv: {TRL_VENV.relative_to(ROOT)} from "
          f"{TRL_REQUIREMENTS.relative_to(ROOT)} (exists: {trl_python().exists()})")
    print(f"  spec: {json.dumps(spec)}")
    print(f"  toolrl: toolrl train --config {REAL_FC_CONFIG.relative_to(ROOT)} "
          + " ".join(real_fc_overrides(spec)))
    load_config(REAL_FC_CONFIG, real_fc_overrides(spec))
    print("  toolrl config: loads and validates")
    problems = []
    if model is None:
        problems.append(f"--model {args.model}: no checkpoint (make smollm2, or a real run "
                        "fetches the default model)")
    if not args.rows.exists():
        problems.append(f"--rows {args.rows}: missing (make real-fc-data)")
    if problems:
        print("\n".join(f"  PROBLEM: {p}" for p in problems))
        return 1
    from transformers import AutoTokenizer

    from toolrl.data import load_rows
    from toolrl.trainer.preflight import check_task_rows

    work = Path(tempfile.mkdtemp(prefix="toolrl-bench-trl-dry-"))
    prep = prepare_real_fc(args, model, work)
    print(f"  rows: {prep['rows']} of {prep['file']} ({prep['skipped_over_budget']} skipped over "
          f"the {prep['prompt_budget']}-token budget), prompts {prep['prompt_tokens_min']}.."
          f"{prep['prompt_tokens_max']} tokens, categories {prep['categories']}; toolrl "
          f"scores every row's gold calls >= {prep['gold_score_min']:g}")
    spec = make_spec(args, str(model), prep["toolrl_file"], str(work / "out"))
    cfg = load_config(REAL_FC_CONFIG, real_fc_overrides(spec))
    rows = load_rows(prep["toolrl_file"])
    kept, _ = check_task_rows(rows, rows, cfg, AutoTokenizer.from_pretrained(model),
                              log=lambda m: print(f"  toolrl preflight: {m}"))
    if len(kept) != len(rows):
        print(f"  PROBLEM: toolrl's preflight keeps {len(kept)} of the {len(rows)} rows")
        return 1
    probe = [str(trl_python()), "-c", "import lazy_loader, trl"]
    if not trl_python().exists() or subprocess.run(probe, capture_output=True).returncode:
        print(f"  TRL side: not checked ({TRL_VENV.relative_to(ROOT)} is missing or stale; a "
              "real run creates it and runs the same checks before its first step)")
        return 0
    trl_spec = work / "trl.json"
    trl_spec.write_text(json.dumps(make_spec(args, str(model), prep["trl_file"],
                                             str(work / "trl"))))
    out = subprocess.run([str(trl_python()), str(TRL_WORKER), str(trl_spec), "--check"],
                         capture_output=True, text=True, env={**os.environ, **benchlib.BENCH_ENV})
    if out.returncode:
        print(f"  PROBLEM: the TRL side's check failed:\n{out.stderr[-3000:]}")
        return 1
    print(f"  TRL side: {out.stdout.strip().splitlines()[-1]} (every prompt tokenizes to "
          "toolrl's ids; every reference completion scores as in toolrl)")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker == "toolrl":
        return toolrl_worker(args.spec)
    real_fc = args.workload == "real_fc"
    if args.dry_run:
        if real_fc:
            return dry_run_real_fc(args)
        print(dry_run_plan(args))
        return 0
    if args.from_raw:  # the run's own arguments, except an --output given now
        given = args.output if any(a.split("=")[0] == "--output" for a in argv) else None
        raw = json.loads(args.from_raw.read_text())
        args = parse_args(raw.get("argv", []))
        plot(raw, "trl_real_fc_step" if args.workload == "real_fc" else "trl_step")
        benchlib.write_result(given or args.output, summarize(raw, args, raw.get("argv", [])))
        return 0
    benchlib.set_bench_env()
    machine = benchlib.machine_label()
    raw = run(args)
    raw["machine"] = machine
    raw["argv"] = argv
    benchlib.save_raw("trl_real_fc" if real_fc else "trl", raw)
    plot(raw, "trl_real_fc_step" if real_fc else "trl_step")
    benchlib.write_result(args.output, summarize(raw, args, argv))
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
