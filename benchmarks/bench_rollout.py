"""Multi-turn rollout throughput on the vLLM CPU engine, against the engine's own ceiling.

One `RolloutWorker` (tiny model, vLLM CPU engine) runs N concurrent episodes of T turns; every
turn samples exactly K tokens (``ignore_eos``) and then makes one real tool call through the
env's tool machinery (`LatencyEnv`: the tool sleeps a fixed latency). Measured:

1. multi-turn rollout output tok/s (sampled tokens / wall time, zero tool latency) as a ratio
   of the same engine's single-batch generate: N requests of T*K tokens each, issued at once
   (the ceiling; target >= 0.9). A diagnostic row runs the same turns straight on the engine
   (generate, append the observation delta, generate again; no env, no records) to show
   how much of the gap is the engine's (new requests and prefills at every turn) and how
   much is the rollout's own work. Each turn length K in ``--tokens`` (default 32 and 128)
   gets its own rows: every new turn costs a roughly fixed amount (a new engine request,
   the prefill of the observation and of the context after the last cached KV block, the
   env step and the delta render), so the ratio depends on how many tokens a turn samples;
   the "extra ms per turn boundary" column states that cost;
2. with every tool taking 100 ms, the rollout's tok/s as a ratio of the zero-latency run
   (N = 64 concurrent episodes, the first K; target >= 0.8).

Runs alternate (ceiling, engine loop, rollout, rollout with latency), so load from other
processes hits all alike, and each starts from an empty prefix cache (the ceiling and the engine
loop replay the same seeds every repetition: a warm cache would hand a run the KV of an earlier
run's identical turns); the medians over the repetitions are reported.

    .venv/bin/python benchmarks/bench_rollout.py [--quick] [--tokens 32,128] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib

RESULTS = Path(__file__).resolve().parent / "results" / "rollout.md"
ENV_ID = "toolrl-bench/Latency-v0"


def latency_env_class():
    from toolrl.core.env import ToolEnv, Turn
    from toolrl.core.parse import ToolCallFormat
    from toolrl.core.tools import tool
    from toolrl.core.types import ParseResult, ToolCall

    class EveryMessageCallsWait(ToolCallFormat):
        """Every assistant message is one call of ``wait`` (a random model 'uses' the tool)."""

        name = "every-message-calls-wait"

        def _parse(self, text: str) -> ParseResult:
            return ParseResult(calls=[ToolCall("wait", {})], text="")

    class LatencyEnv(ToolEnv):
        """Each turn runs one real tool call taking ``latency`` s; ends after ``turns`` turns."""

        def __init__(self, latency: float = 0.0, turns: int = 4, **kwargs):
            super().__init__(max_turns=turns + 1, **kwargs)
            self.parser = EveryMessageCallsWait()
            self.latency, self.turns = latency, turns

        @classmethod
        def make_tasks(cls, n, seed=0, split="train", **kwargs):
            return [{"id": f"bench-{i}", "question": f"Task {i}: wait, then report."}
                    for i in range(n)]

        @tool
        async def wait(self) -> str:
            """Wait for the service."""
            if self.latency:
                await asyncio.sleep(self.latency)
            return "done"

        def on_turn(self, parse, results):
            return Turn(terminated=self.turn >= self.turns)

        def evaluate(self):
            return True

    return LatencyEnv


def machine_label() -> str:
    import torch
    import vllm

    return benchlib.machine_label(torch=torch.__version__, vllm=vllm.__version__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--model", help="model directory (default: build the tiny model)")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", default="32,128",
                        help="sampled tokens per turn; a comma list measures each")
    parser.add_argument("--latency", type=float, default=0.1, help="tool latency in seconds")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=None, help="KV cache block size")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # for the report's Reproduce line
    turn_tokens = [int(x) for x in str(args.tokens).split(",")]
    if args.quick:
        args.episodes, args.turns, args.reps = min(args.episodes, 16), min(args.turns, 2), 1
        turn_tokens = turn_tokens[:1]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from toolrl import batch as B
    from toolrl.core.registration import register_env
    from toolrl.models.tiny import build_tiny_model
    from toolrl.rollout.engine import EngineConfig, SamplingConfig
    from toolrl.rollout.worker import RolloutConfig, RolloutWorker, make_rollout_input

    env_cls = latency_env_class()
    register_env(ENV_ID, env_cls)
    model = args.model or str(build_tiny_model(Path(tempfile.gettempdir())
                                               / "toolrl-bench-tiny"))
    n, t = args.episodes, args.turns
    # the engine as the trainer builds it: the model runs inside the engine-core process
    config = RolloutConfig(
        engine=EngineConfig(model=model, max_model_len=2048, kv_cache_gib=1.0,
                            block_size=args.block_size, multiprocessing=False),
        max_tokens_per_turn=turn_tokens[0], ignore_eos=True, max_prompt_tokens=512,
        max_total_tokens=2048, max_turns=32, env_id=ENV_ID, env_kwargs={"turns": t},
        concurrency=n, seed=0)
    worker = RolloutWorker(config)
    block = worker.engine.block_size
    rows = env_cls.make_tasks(n)
    delta = worker.renderer.render_delta([{"role": "tool", "name": "wait", "content": "done"}],
                                         after_eos=False)
    prompts = [worker.renderer.render_prompt(
        [{"role": "user", "content": r["question"]}], env_cls().tools_schema()) for r in rows]

    def ceiling(k: int) -> tuple[int, float]:
        """Every episode's tokens as one request, all issued at once."""
        cfg = SamplingConfig(max_tokens=t * k, ignore_eos=True)

        async def run():
            return await asyncio.gather(*(worker.engine.generate(p, cfg.replace(seed=i))
                                          for i, p in enumerate(prompts)))
        t0 = time.perf_counter()
        outs = asyncio.run(run())
        return sum(len(o[0].token_ids) for o in outs), time.perf_counter() - t0

    reprefill: dict[int, list[int]] = {k: [] for k in turn_tokens}  # tokens per boundary

    def engine_loop(k: int) -> tuple[int, float]:
        """The same turns straight on the engine: no env, no records, no batch."""
        cfg = SamplingConfig(max_tokens=k, ignore_eos=True)

        async def episode(ids: list[int], i: int) -> int:
            sampled = 0
            for turn in range(t):
                [c] = await worker.engine.generate(ids, cfg.replace(seed=i * t + turn))
                if turn < t - 1:  # the next turn prefills what its KV cache does not hold
                    computed = len(ids) + len(c.token_ids) - 1  # the last sampled token: none
                    reprefill[k].append(len(ids) + len(c.token_ids) + len(delta)
                                        - block * (computed // block))
                ids = ids + c.token_ids + delta
                sampled += len(c.token_ids)
            return sampled

        async def run():
            return await asyncio.gather(*(episode(list(p), i) for i, p in enumerate(prompts)))
        t0 = time.perf_counter()
        tokens = sum(asyncio.run(run()))
        return tokens, time.perf_counter() - t0

    def rollout(k: int, latency: float = 0.0) -> tuple[int, float]:
        worker.config.env_kwargs = {"turns": t, "latency": latency}
        episode_config = worker.config.episode_config()
        episode_config.sampling = SamplingConfig(max_tokens=k, ignore_eos=True)
        worker.runner = type(worker.runner)(worker.engine, worker.renderer, episode_config)
        t0 = time.perf_counter()
        td = worker.rollout(make_rollout_input(rows))
        wall = time.perf_counter() - t0
        tokens = int(td["response_mask"].sum())
        finished = [r.num_turns for r in B.trajectories(td)]
        assert finished == [t] * n, f"episodes did not run {t} turns: {finished}"
        return tokens, wall

    def cold(f: Any, *a: Any) -> tuple[int, float]:
        """``f`` from an empty prefix cache: each measurement replays the same seeds, so a warm
        cache would hand a later run the KV of an earlier one's identical turns."""
        asyncio.run(worker.engine.reset_prefix_cache())
        return f(*a)

    measures = {"ceiling": ceiling, "engine_loop": engine_loop, "rollout": rollout}
    runs: dict[tuple[str, int], list[tuple[int, float]]] = {}
    try:
        for k in turn_tokens:
            for f in measures.values():
                cold(f, k)  # warm-up
            for _ in range(args.reps):
                for name, f in measures.items():
                    runs.setdefault((name, k), []).append(cold(f, k))
                if k == turn_tokens[0]:
                    runs.setdefault(("latency", k), []).append(cold(rollout, k, args.latency))
        load = os.getloadavg()[0]
    finally:
        worker.shutdown()

    def ratio(a: str, b: str, k: int) -> float:
        return statistics.median((ta / wa) / (tb / wb) for (ta, wa), (tb, wb)
                                 in zip(runs[a, k], runs[b, k], strict=True))

    def rate(name: str, k: int) -> float:
        return statistics.median(tok / wall for tok, wall in runs[name, k])

    def per_boundary_ms(name: str, k: int) -> float:
        """Extra wall time per turn boundary over the ceiling (all episodes at once)."""
        extra = statistics.median(w for _, w in runs[name, k]) - \
            statistics.median(w for _, w in runs["ceiling", k])
        return 1000 * extra / max(t - 1, 1)

    lines = ["| sampled tokens per turn | measurement | output tok/s (median) | ratio "
             "| extra ms per turn boundary | target |", "|---:|---|---:|---:|---:|---:|"]
    for k in turn_tokens:
        lines += [
            f"| {k} | single-batch generate, {n} x {t * k} tokens (ceiling) "
            f"| {rate('ceiling', k):.0f} | 1.00 | | |",
            f"| {k} | (diagnostic) the same turns straight on the engine: no env, no records "
            f"| {rate('engine_loop', k):.0f} | {ratio('engine_loop', 'ceiling', k):.2f} "
            f"| {per_boundary_ms('engine_loop', k):.0f} | |",
            f"| {k} | multi-turn rollout, {n} episodes x {t} turns, no tool latency "
            f"| {rate('rollout', k):.0f} | {ratio('rollout', 'ceiling', k):.2f} "
            f"| {per_boundary_ms('rollout', k):.0f} | >= 0.9 |"]
    k0 = turn_tokens[0]
    lines.append(f"| {k0} | same, every tool call {args.latency * 1000:.0f} ms, {n} concurrent "
                 f"| {rate('latency', k0):.0f} | {ratio('latency', 'rollout', k0):.2f} "
                 f"(of no latency) | | >= 0.8 |")
    def verdict(value: float, target: float) -> str:
        return "met" if value >= target else "NOT met"

    shares = ", ".join(f"{ratio('rollout', 'ceiling', k):.2f} at {k}-token turns "
                       f"(engine alone {ratio('engine_loop', 'ceiling', k):.2f}; the rollout "
                       f"{ratio('rollout', 'engine_loop', k):.2f} of it)"
                       for k in turn_tokens)

    def boundary_account(k: int) -> str:
        """What a turn boundary costs the engine, and the ratio left if it prefilled only the
        observation and the last sampled token (none of the context's tail) at that cost."""
        per_episode = statistics.mean(reprefill[k])
        ms_per_token = per_boundary_ms("engine_loop", k) / (n * per_episode)
        ceiling_wall = statistics.median(w for _, w in runs["ceiling", k])
        least = (t - 1) * n * (len(delta) + 1) * ms_per_token / 1000
        return (f"at {k}-token turns each boundary prefills {per_episode:.0f} tokens an "
                f"episode ({len(delta)} of the observation, the last sampled token, the rest "
                f"the context's tail after its last full {block}-token KV block, which the "
                f"prefix cache cannot keep), {ms_per_token:.1f} ms a token of the engine's "
                f"time; prefilling only the observation and the last token at that cost "
                f"would leave at most {ceiling_wall / (ceiling_wall + least):.2f} of the "
                f"ceiling")
    first = ratio("rollout", "ceiling", k0)
    with_latency = ratio("latency", "rollout", k0)
    headline = (f"**Multi-turn rollout / single-batch ceiling: {shares} (target >= 0.9 at "
                f"{k0}-token turns: {verdict(first, 0.9)}); {args.latency * 1000:.0f} ms tools "
                f"keep {with_latency:.2f}x (target >= 0.8: {verdict(with_latency, 0.8)}).**")
    command = " ".join([".venv/bin/python", "benchmarks/bench_rollout.py", *args.argv])
    model = f": {Path(args.model).name}" if args.model else ""
    text = (f"# Rollout throughput{model}\n\nMachine: {machine_label()}; load average at the end "
            f"{load:.1f} (other processes share the cores).\n\n{headline}\n\n" +
            "\n".join(lines) +
            f"\n\nRatios are medians over {args.reps} alternating repetition(s) of (ceiling, "
            f"engine loop, rollout[, rollout with latency]) per row group, each from an empty "
            f"prefix cache (the runs replay the same seeds); KV cache block size "
            f"{block}; the engine as the trainer builds it (model inside the engine-core "
            f"process). Each rollout turn samples exactly the stated tokens (ignore_eos) and "
            f"makes one real tool call through the env; the observation "
            f"({len(delta)} tokens) is appended as a template delta and prefilled before the "
            f"next turn. \"Extra ms per turn boundary\" is (wall - ceiling wall) / "
            f"{max(t - 1, 1)}: what each new turn of all {n} episodes costs beyond sampling.\n\n"
            f"Where a boundary goes: " + "; ".join(boundary_account(k) for k in turn_tokens) +
            ". The ceiling prefills none of it: it samples every turn's tokens in one request."
            "\n\n"
            f"Reproduce: `{command}`\n")
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
