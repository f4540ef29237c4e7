"""Multi-turn rollout throughput on the vLLM CPU engine, against the engine's own ceiling.

One `RolloutWorker` (tiny model, vLLM CPU engine) runs N concurrent episodes of T turns; every
turn samples exactly K tokens (``ignore_eos``) and then makes one real tool call through the
env's tool machinery (`LatencyEnv`: the tool sleeps a fixed latency). Measured:

1. multi-turn rollout output tok/s (sampled tokens / wall time, zero tool latency) as a ratio
   of the same engine's single-batch generate: N requests of T*K tokens each, issued at once
   (the ceiling; target >= 0.9). A diagnostic row runs the same turns straight on the engine
   (generate, append the observation delta, generate again; no env, no records) to show
   how much of the gap is the engine's (new requests and prefills at every turn) and how
   much is the rollout's own work;
2. with every tool taking 100 ms, the rollout's tok/s as a ratio of the zero-latency run
   (N = 64 concurrent episodes; target >= 0.8).

Runs alternate (ceiling, rollout, rollout with latency), so load from other processes hits
all alike; the medians over the repetitions are reported.

    .venv/bin/python benchmarks/bench_rollout.py [--quick] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

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
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch
    import vllm

    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}, vllm {vllm.__version__}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--model", help="model directory (default: build the tiny model)")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32, help="sampled tokens per turn")
    parser.add_argument("--latency", type=float, default=0.1, help="tool latency in seconds")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=None, help="KV cache block size")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.episodes, args.turns, args.reps = min(args.episodes, 16), min(args.turns, 2), 1
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from toolrl.core.registration import register_env
    from toolrl.models.tiny import build_tiny_model
    from toolrl.rollout import (
        EngineConfig,
        RolloutConfig,
        RolloutWorker,
        SamplingConfig,
        make_rollout_input,
    )

    env_cls = latency_env_class()
    register_env(ENV_ID, env_cls)
    model = args.model or str(build_tiny_model(Path(tempfile.gettempdir())
                                               / "toolrl-bench-tiny"))
    n, t, k = args.episodes, args.turns, args.tokens
    sampling = SamplingConfig(max_tokens=k, ignore_eos=True)
    config = RolloutConfig(
        engine=EngineConfig(model=model, max_model_len=2048, kv_cache_gib=1.0,
                            block_size=args.block_size),
        sampling=sampling, max_prompt_len=512, max_response_len=1536, env_id=ENV_ID,
        env_kwargs={"turns": t}, concurrency=n, seed=0)
    worker = RolloutWorker(config)
    block = worker.engine.block_size
    rows = env_cls.make_tasks(n)
    try:
        prompts = [worker.renderer.render_prompt(
            [{"role": "user", "content": r["question"]}], env_cls().tools_schema())
            for r in rows]

        def ceiling() -> tuple[int, float]:
            async def run():
                cfg = sampling.replace(max_tokens=t * k)
                return await asyncio.gather(*(worker.engine.generate(p, cfg.replace(seed=i))
                                              for i, p in enumerate(prompts)))
            t0 = time.perf_counter()
            outs = asyncio.run(run())
            return sum(len(o[0].token_ids) for o in outs), time.perf_counter() - t0

        delta = worker.renderer.render_delta([{"role": "tool", "name": "wait",
                                                "content": "done"}], after_eos=False)

        def engine_loop() -> tuple[int, float]:
            """The same turns straight on the engine: no env, no records, no batch."""
            async def episode(ids: list[int], i: int) -> int:
                sampled = 0
                for turn in range(t):
                    [c] = await worker.engine.generate(ids, sampling.replace(seed=i * t + turn))
                    ids = ids + c.token_ids + delta
                    sampled += len(c.token_ids)
                return sampled

            async def run():
                return await asyncio.gather(*(episode(list(p), i)
                                              for i, p in enumerate(prompts)))
            t0 = time.perf_counter()
            tokens = sum(asyncio.run(run()))
            return tokens, time.perf_counter() - t0

        def rollout(latency: float) -> tuple[int, float]:
            worker.config.env_kwargs = {"turns": t, "latency": latency}
            t0 = time.perf_counter()
            td = worker.rollout(make_rollout_input(rows))
            wall = time.perf_counter() - t0
            tokens = int(td["response_mask"].sum())
            finished = [r["num_turns"] for r in td["episodes"]]
            assert finished == [t] * n, f"episodes did not run {t} turns: {finished}"
            return tokens, wall

        ceiling(), engine_loop(), rollout(0.0)  # warm-up
        runs: dict[str, list[tuple[int, float]]] = {
            "ceiling": [], "engine_loop": [], "rollout": [], "latency": []}
        for _ in range(args.reps):
            runs["ceiling"].append(ceiling())
            runs["engine_loop"].append(engine_loop())
            runs["rollout"].append(rollout(0.0))
            runs["latency"].append(rollout(args.latency))
        load = os.getloadavg()[0]
    finally:
        worker.shutdown()

    rate = {name: [tok / wall for tok, wall in r] for name, r in runs.items()}
    ratio_ceiling = statistics.median(a / b for a, b in zip(rate["rollout"], rate["ceiling"],
                                                             strict=True))
    ratio_loop = statistics.median(a / b for a, b in zip(rate["engine_loop"], rate["ceiling"],
                                                          strict=True))
    ratio_latency = statistics.median(a / b for a, b in zip(rate["latency"], rate["rollout"],
                                                             strict=True))
    tokens = runs["rollout"][0][0]
    med = {name: statistics.median(v) for name, v in rate.items()}
    quick = " --quick" if args.quick else ""
    table = "\n".join([
        "| measurement | output tok/s (median) | ratio | target |",
        "|---|---:|---:|---:|",
        f"| single-batch generate, {n} x {t * k} tokens (ceiling) | {med['ceiling']:.0f} | 1.00 "
        f"| |",
        f"| (diagnostic) the same turns straight on the engine: no env, no records "
        f"| {med['engine_loop']:.0f} | {ratio_loop:.2f} (of ceiling) | |",
        f"| multi-turn rollout, {n} episodes x {t} turns x {k} tokens, no tool latency "
        f"| {med['rollout']:.0f} | {ratio_ceiling:.2f} (of ceiling) | >= 0.9 |",
        f"| same, every tool call {args.latency * 1000:.0f} ms, {n} concurrent "
        f"| {med['latency']:.0f} | {ratio_latency:.2f} (of no latency) | >= 0.8 |",
    ])
    text = (f"# Rollout throughput\n\nMachine: {machine_label()}; load average at the end "
            f"{load:.1f} (other processes share the cores).\n\n{table}\n\n"
            f"{tokens} sampled tokens per run; ratios are medians over {args.reps} alternating "
            f"repetition(s) of (ceiling, engine loop, rollout, rollout with latency); KV cache "
            f"block size {block}. Each rollout turn "
            f"samples {k} tokens (ignore_eos) and makes one real tool call through the env; "
            f"observation tokens are appended as template deltas.\n\n"
            f"Reproduce: `.venv/bin/python benchmarks/bench_rollout.py{quick}`\n")
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
