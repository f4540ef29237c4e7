"""Gateway rollout vs the in-process env rollout on the same episodes.

The same multi-turn episodes are played twice on one vLLM engine (the tiny model, in this
process): by the env path (`EpisodeRunner`: token ids straight into the engine, template deltas
for the observations) and by an agent through the OpenAI-compatible gateway (`AgentRunner`:
the official ``openai`` client over HTTP on loopback, the gateway renders, samples, parses and
captures every call). Both decode greedily with the same per-turn budget, so they sample the
same tokens (checked): the ratio of sampled tokens per second is the gateway's cost. The env is
``toolrl-bench/Turns-v0`` (every message is one tool call; the episode ends after ``--turns``).
The two paths alternate, ``--reps`` times.

    .venv/bin/python benchmarks/bench_gateway.py [--quick] [--episodes 64] [--turns 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import md_table, median

RESULTS = benchlib.RESULTS_DIR / "gateway.md"


def make_agent(turns: int, max_tokens: int):
    """A plain tool loop: the env's prompt and tools, the model's text into the env, the
    env's observations back as messages."""
    import toolrl
    from toolrl.core.env import resolve_astep

    async def solve(client: Any, row: dict[str, Any]) -> dict[str, Any]:
        env = toolrl.make_env(benchlib.TURNS_ENV_ID)
        try:
            messages, info = env.reset(options=row)
            for _ in range(turns):
                r = await client.chat.completions.create(
                    model="policy", messages=messages, tools=info["tools"],
                    max_tokens=max_tokens, tool_choice="none")
                msg = r.choices[0].message
                obs, _, terminated, truncated, _ = await resolve_astep(env)(msg.content or "")
                messages = [*messages, msg.model_dump(exclude_none=True),
                            *({"tool_call_id": f"call_{i}", **o} for i, o in enumerate(obs))]
                if terminated or truncated:
                    break
            return {"success": True}
        finally:
            env.close()

    return solve


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer episodes and repetitions")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32, help="most sampled tokens per turn")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.reps = min(args.episodes, 16), min(args.reps, 1)
    if args.dry_run:
        print(f"gateway plan: {args.episodes} episodes x {args.turns} turns x <= {args.tokens} "
              f"tokens, {args.reps} alternating reps -> {args.output}")
        return 0
    benchlib.set_bench_env()
    import toolrl
    from toolrl.rollout.chat import ChatRenderer
    from toolrl.rollout.engine import EngineConfig, SamplingConfig, VLLMEngine
    from toolrl.rollout.episode import EpisodeConfig, EpisodeRunner
    from toolrl.rollout.gateway.agent import AgentRunner

    env_cls = benchlib.register_bench_envs()
    rows = env_cls.make_tasks(args.episodes, seed=0, turns=args.turns)
    engine = VLLMEngine(EngineConfig(model=str(benchlib.tiny_model("small")), max_model_len=1024,
                                     kv_cache_gib=1.0, multiprocessing=False))
    try:
        renderer = ChatRenderer(engine.tokenizer)
        runner = EpisodeRunner(engine, renderer, EpisodeConfig(
            sampling=SamplingConfig(temperature=0.0, max_tokens=args.tokens),
            max_turns=args.turns, max_prompt_len=384, max_response_len=600))
        agents = AgentRunner(engine, renderer, make_agent(args.turns, args.tokens),
                             format="toolrl-bench/every-message-is-a-call",
                             concurrency=args.episodes, max_tokens=args.tokens,
                             max_prompt_tokens=384, max_response_tokens=600, timeout_s=600)
        got: dict[str, list[Any]] = {}

        async def env_path() -> list[Any]:
            async def one(row):
                env = toolrl.make_env(benchlib.TURNS_ENV_ID)
                try:
                    return await runner.run(env, row, seed=0)
                finally:
                    env.close()
            return list(await asyncio.gather(*(one(r) for r in rows)))

        def run_env() -> None:
            got["env"] = asyncio.run(env_path())

        def run_gateway() -> None:
            got["gateway"] = asyncio.run(agents.run_all(rows, [0] * len(rows), 0.0))

        times = benchlib.timed_alternating([run_env, run_gateway], args.reps)
        agents.close()
    finally:
        engine.shutdown()
    env_trajs = got["env"]
    gw = [(t, s) for t, s in got["gateway"]]
    env_tokens = sum(t.sampled_tokens for t in env_trajs)
    gw_tokens = sum(t.sampled_tokens for t, _ in gw)
    same = all(len(s) == 1 and s[0].tokens.response_ids ==
               e.tokens.response_ids[: len(s[0].tokens.response_ids)]
               and s[0].tokens.prompt_ids == e.tokens.prompt_ids
               for e, (_, s) in zip(env_trajs, gw, strict=True))
    failed = sum(t.infra_failure is not None for t, _ in gw)
    env_s, gw_s = median(times[0]), median(times[1])
    env_tps, gw_tps = env_tokens / env_s, gw_tokens / gw_s
    ratio = gw_tps / env_tps
    calls = sum(t.extra["gateway"]["calls"] for t, _ in gw)
    per_round_ms = (gw_s - env_s) / args.turns * 1e3
    machine = benchlib.machine_label()
    text = "\n".join([
        "# Gateway rollout vs the in-process env rollout",
        "",
        f"Machine: {machine}.",
        "",
        f"Command: `{benchlib.command_line('bench_gateway.py', argv)}`",
        "",
        f"{args.episodes} concurrent episodes of `{benchlib.TURNS_ENV_ID}` x {args.turns} turns, "
        f"greedy, at most {args.tokens} sampled tokens per turn, the tiny model on the vLLM "
        f"CPU engine in this process; median of {args.reps} alternating repetition(s).",
        "",
        md_table(["path", "sampled tokens", "wall s (median)", "sampled tok/s", "ratio"], [
            ("env path (EpisodeRunner, in-process)", env_tokens, f"{env_s:.2f}",
             f"{env_tps:.0f}", "1.00"),
            ("gateway (openai client -> HTTP -> Gateway -> engine)", gw_tokens,
             f"{gw_s:.2f}", f"{gw_tps:.0f}", f"{ratio:.2f}"),
        ]),
        "",
        f"**Gateway rollout / env rollout, sampled tok/s on the same episodes: {ratio:.2f}x** "
        f"({calls} model calls; same sampled tokens as the env path: "
        f"{'yes' if same else 'NO'}; infra-failed agent episodes: {failed}).",
        "",
        f"Each turn of all {args.episodes} episodes costs {per_round_ms:.0f} ms more through "
        "the gateway ((gateway wall - env wall) / turns): the openai client, HTTP on loopback, "
        "request validation, the delta rendered from the messages, decoding and parsing the "
        "reply, all on the same 2 cores as the engine.",
        "",
    ])
    benchlib.write_result(args.output, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
