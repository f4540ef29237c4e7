"""MCP episodes per second: one stdio server per episode vs one per rollout worker.

``toolrl/MCP-v0`` over stdio (the shipped textkit server), driven as a rollout worker drives
episodes: one asyncio loop, at most ``--concurrency`` episodes at once, ``make_env`` per
episode and ``close`` after it, the env's scripted oracle as the policy (no model: the tool
path alone). Two modes, timed alternately in one run:

- ``session="episode"``: each episode starts its own server process (what MCP-v0 did for
  every episode before sessions were shared);
- ``session="shared"`` (the default): the process's one server, started once and shared by
  every episode (its start is paid once, in the warm-up, as a worker pays it once).

    .venv/bin/python benchmarks/bench_mcp.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import md_table, median

RESULTS = benchlib.RESULTS_DIR / "mcp.md"
ENV_ID = "toolrl/MCP-v0"


def play(session: str, rows: list[dict], concurrency: int) -> float:
    """Run every row's episode; returns the success rate (a check that the work was done)."""
    import toolrl

    async def run() -> list[bool]:
        sem = asyncio.Semaphore(concurrency)

        async def one(row: dict) -> bool:
            async with sem:
                env = toolrl.make_env(ENV_ID, session=session, connect_timeout=120)
                try:
                    return (await toolrl.run_episode(env, row=row)).success
                finally:
                    env.close()

        return await asyncio.gather(*(one(r) for r in rows))

    ok = asyncio.run(run())
    return sum(ok) / len(ok)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer episodes and repetitions")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--episodes", type=int, default=16, help="episodes per timed batch")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.reps = min(args.episodes, 8), min(args.reps, 1)
    if args.dry_run:
        print(f"MCP plan: {args.reps} x {args.episodes} episodes per mode, concurrency "
              f"{args.concurrency} -> {args.output}")
        return 0
    from toolrl.envs.mcp.env import MCPEnv

    import toolrl

    rows = MCPEnv.make_tasks(args.episodes, seed=0)
    modes = ("episode", "shared")
    success: dict[str, float] = {}

    def batch(mode: str):
        def fn() -> None:
            success[mode] = play(mode, rows, args.concurrency)
        return fn

    try:
        start = time.perf_counter()
        play("shared", rows, args.concurrency)  # cold: the worker's one server start included
        cold = time.perf_counter() - start
        times = benchlib.timed_alternating([batch(m) for m in modes], args.reps)
    finally:
        toolrl.close_mcp_connections()
    eps = {m: args.episodes / median(t) for m, t in zip(modes, times, strict=True)}
    ratio = eps["shared"] / eps["episode"]
    started = {"episode": f"{args.episodes} (one per episode)",
               "shared": "0 (one per worker, at its first episode)"}
    table = [(f'`session="{m}"`', f"{median(t):.2f}", f"{eps[m]:.1f}", started[m],
              f"{success[m]:.2f}") for m, t in zip(modes, times, strict=True)]
    table.append(('`session="shared"`, first batch of a worker', f"{cold:.2f}",
                  f"{args.episodes / cold:.1f}", "1", "1.00"))
    text = "\n".join([
        "# MCP episodes per second: a server per episode vs one per worker",
        "",
        f"Machine: {benchlib.machine_label()}.",
        "",
        f"Command: `{benchlib.command_line('bench_mcp.py', argv)}`",
        "",
        f"`{ENV_ID}` over stdio (the textkit server), {args.episodes} episodes per batch, "
        f"{args.concurrency} at once on one asyncio loop, `make_env` and `close` per episode, "
        f"the scripted oracle as the policy; median over {args.reps} alternating batches.",
        "",
        md_table(["mode", "s per batch", "episodes/s", "servers started in the batch",
                  "success"], table),
        "",
        f"**One server per worker: {eps['shared']:.1f} episodes/s vs {eps['episode']:.1f} with "
        f"a server per episode ({ratio:.0f}x); a worker's first batch, which starts the server, "
        f"{args.episodes / cold:.1f} episodes/s.**",
        "",
        "A server per episode pays the server's start (a Python interpreter importing the MCP "
        "SDK) and the connect for every episode, on the worker's loop; a shared session pays it "
        "once per worker, and the episodes' calls then overlap on one session.",
        "",
    ])
    benchlib.write_result(args.output, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
