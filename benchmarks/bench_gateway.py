"""Gateway rollout vs the in-process env rollout on the same episodes, per API route.

The same multi-turn episodes are played on one vLLM engine (the tiny model, in this process): by
the env path (`EpisodeRunner`: token ids straight into the engine, template deltas for the
observations) and by an agent through the gateway (`AgentRunner`; the gateway renders, samples,
parses and captures every call), once per route: Chat Completions and the Responses API with the
official ``openai`` client, Anthropic's Messages API with the official ``anthropic`` client. The
agent's client reaches the gateway in-process (`AgentRunner`'s default: the gateway's own httpx
transport, `Gateway.transport`); Chat Completions is also timed over HTTP on loopback (uvicorn).
Episodes run on the engine's event loop and the long-lived heap is frozen out of the garbage
collector, as in a `RolloutWorker`. All decode greedily with the same per-turn budget, so they
sample the same tokens (checked): the ratio of sampled tokens per second is each route's cost.
The env is ``toolrl-bench/Turns-v0`` (every message is one tool call; the episode ends after
``--turns``). The paths alternate, ``--reps`` times.

    .venv/bin/python benchmarks/bench_gateway.py [--quick] [--episodes 64] [--turns 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import md_table, median

RESULTS = benchlib.RESULTS_DIR / "gateway.md"


def make_agent(turns: int, max_tokens: int, api: str = "chat"):
    """A plain tool loop on one API (``chat``, ``responses``, ``responses-chained``,
    ``messages``): the env's prompt and tools, the model's text into the env, the env's
    observations back as tool results. ``responses`` sends the whole input every call (the
    output items as they came back, as OpenAI's guides write it), ``responses-chained`` only
    the new items after ``previous_response_id`` (the gateway keeps the conversation)."""
    import toolrl
    from toolrl.core.env import resolve_astep

    async def ask(client: Any, system: str, history: list[Any], tools: list[Any],
                  chain: dict[str, Any]) -> str:
        """One call; appends the reply to ``history``, returns its text. ``chain`` is the
        episode's own: the last response's id and how many items of ``history`` it holds."""
        if api == "chat":
            r = await client.chat.completions.create(
                model="policy", messages=history, tools=tools, max_tokens=max_tokens,
                tool_choice="none")
            msg = r.choices[0].message
            history.append(msg.model_dump(exclude_none=True))
            return msg.content or ""
        if api.startswith("responses"):
            previous, held = chain.get("previous"), chain.get("held", 0)
            chained = api == "responses-chained" and previous is not None
            r = await client.responses.create(
                model="policy", instructions=system or None, max_output_tokens=max_tokens,
                input=history[held:] if chained else history,
                tools=[{"type": "function", **t["function"]} for t in tools], tool_choice="none",
                **({"previous_response_id": previous} if chained else {}))
            history += r.output  # the output items as they came (OpenAI's guides do so)
            chain.update(previous=r.id, held=len(history))
            return r.output_text
        m = await client.messages.create(
            model="policy", **({"system": system} if system else {}), messages=history,
            max_tokens=max_tokens,
            tools=[{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in tools],
            tool_choice={"type": "none"})
        history.append({"role": "assistant",
                        "content": [b.model_dump(exclude_none=True) for b in m.content]})
        return "".join(b.text for b in m.content if b.type == "text")

    def results(observations: list[dict[str, Any]]) -> list[Any]:
        ids = [f"call_{i}" for i in range(len(observations))]
        if api == "chat":
            return [{"tool_call_id": i, **o} for i, o in zip(ids, observations, strict=True)]
        if api.startswith("responses"):
            return [{"type": "function_call_output", "call_id": i, "output": o["content"]}
                    for i, o in zip(ids, observations, strict=True)]
        return [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": i, "content": o["content"]}
            for i, o in zip(ids, observations, strict=True)]}]

    async def solve(client: Any, row: dict[str, Any]) -> dict[str, Any]:
        env = toolrl.make_env(benchlib.TURNS_ENV_ID)
        try:
            messages, info = env.reset(options=row)
            system = "".join(m["content"] for m in messages if m["role"] == "system")
            history = list(messages) if api == "chat" else [
                {"role": m["role"], "content": m["content"]} for m in messages
                if m["role"] != "system"]
            chain: dict[str, Any] = {}
            for _ in range(turns):
                text = await ask(client, system, history, info["tools"], chain)
                obs, _, terminated, truncated, _ = await resolve_astep(env)(text)
                history += results(obs)
                if terminated or truncated:
                    break
            return {"success": True}
        finally:
            env.close()

    return solve


# (route, API, transport, client, label)
ROUTES = [
    ("chat", "chat", "inprocess", "openai",
     "Chat Completions, in-process (openai client -> transport -> Gateway -> engine)"),
    ("chat-http", "chat", "http", "openai",
     "Chat Completions over HTTP (openai client -> loopback -> uvicorn -> Gateway)"),
    ("responses", "responses", "inprocess", "openai",
     "Responses API, whole input each call, in-process (openai client -> transport -> Gateway)"),
    ("responses-plain", "responses", "inprocess", "openai",
     "Responses API, whole input each call, the openai SDK's request transform replaced by a "
     "plain dump (diagnostic: the route without the client's transform)"),
    ("responses-chained", "responses-chained", "inprocess", "openai",
     "Responses API, previous_response_id, in-process (openai client -> transport -> Gateway)"),
    ("messages", "messages", "inprocess", "anthropic",
     "Messages API, in-process (anthropic client -> transport -> Gateway -> engine)"),
]


@contextlib.contextmanager
def plain_responses_transform():
    """The openai SDK's request transform for ``responses.create`` replaced by a plain dump
    (pydantic items dumped, omitted values dropped): the same JSON body for the items an agent
    sends here, without the SDK walking every item through the union of item types. A
    diagnostic that splits the agent's client cost from the route's; nothing ships it."""
    import openai.resources.responses.responses as module
    import pydantic
    from openai._utils import is_given

    def plain(data: Any) -> Any:
        if isinstance(data, pydantic.BaseModel):
            return data.model_dump(exclude_unset=True, mode="json")
        if isinstance(data, dict):
            return {k: plain(v) for k, v in data.items() if is_given(v)}
        if isinstance(data, (list, tuple)):
            return [plain(v) for v in data]
        return data

    async def transform(data: Any, expected_type: Any) -> Any:
        return plain(data)

    original = module.async_maybe_transform
    module.async_maybe_transform = transform
    try:
        yield
    finally:
        module.async_maybe_transform = original


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer episodes and repetitions")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32, help="most sampled tokens per turn")
    p.add_argument("--reps", type=int, default=5)
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
        runners = {route: AgentRunner(
            engine, renderer, make_agent(args.turns, args.tokens, api),
            format="toolrl-bench/every-message-is-a-call", concurrency=args.episodes,
            max_tokens=args.tokens, max_prompt_tokens=384, max_response_tokens=600,
            timeout_s=600, transport=transport, client=client)
            for route, api, transport, client, _ in ROUTES}
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
            got["env"] = engine.run_on_loop(env_path())

        def gateway(route: str):
            def run() -> None:
                with (plain_responses_transform() if route == "responses-plain"
                      else contextlib.nullcontext()):
                    got[route] = engine.run_on_loop(runners[route].run_all(
                        rows, [0] * len(rows), 0.0))
            return run

        from vllm.utils.gc_utils import freeze_gc_heap

        freeze_gc_heap()  # as `RolloutWorker` does after its start

        try:
            times = benchlib.timed_alternating(
                [run_env, *(gateway(route) for route, *_ in ROUTES)], args.reps)
        finally:
            for r in runners.values():
                r.close()
    finally:
        engine.shutdown()
    env_trajs = got["env"]
    env_tokens = sum(t.sampled_tokens for t in env_trajs)
    env_s = median(times[0])
    env_tps = env_tokens / env_s
    rows_out, summary = [("env path (EpisodeRunner, in-process)", env_tokens, f"{env_s:.2f}",
                          f"{env_tps:.0f}", "1.00", "")], {}
    for k, (route, _, _, _, label) in enumerate(ROUTES):
        gw = got[route]
        tokens = sum(t.sampled_tokens for t, _ in gw)
        same = all(len(s) == 1 and s[0].tokens.response_ids ==
                   e.tokens.response_ids[: len(s[0].tokens.response_ids)]
                   and s[0].tokens.prompt_ids == e.tokens.prompt_ids
                   for e, (_, s) in zip(env_trajs, gw, strict=True))
        failed = sum(t.infra_failure is not None for t, _ in gw)
        for t, _ in gw:
            if t.infra_failure is not None:
                print(f"{route}: {t.row.get('id')}: {t.error}", file=sys.stderr)
        wall = median(times[k + 1])
        ratio = tokens / wall / env_tps
        per_rep = sorted(e / g for e, g in zip(times[0], times[k + 1], strict=True))
        summary[route] = {"ratio": ratio, "same": same, "failed": failed,
                          "spread": f"{per_rep[0]:.2f}-{per_rep[-1]:.2f}",
                          "calls": sum(t.extra["gateway"]["calls"] for t, _ in gw),
                          "per_round_ms": (wall - env_s) / args.turns * 1e3}
        rows_out.append((label, tokens, f"{wall:.2f}", f"{tokens / wall:.0f}", f"{ratio:.2f}",
                         "yes" if same else "NO"))
    ip, hp = summary["chat"], summary["chat-http"]
    rs, rc, ms = summary["responses"], summary["responses-chained"], summary["messages"]
    rp = summary["responses-plain"]
    failed = sum(x["failed"] for x in summary.values())
    machine = benchlib.machine_label()
    text = "\n".join([
        "# Gateway rollout vs the in-process env rollout, per API route",
        "",
        f"Machine: {machine}.",
        "",
        f"Command: `{benchlib.command_line('bench_gateway.py', argv)}`",
        "",
        f"{args.episodes} concurrent episodes of `{benchlib.TURNS_ENV_ID}` x {args.turns} turns, "
        f"greedy, at most {args.tokens} sampled tokens per turn, the tiny model on the vLLM "
        f"CPU engine in this process; median of {args.reps} alternating repetition(s).",
        "",
        md_table(["path", "sampled tokens", "wall s (median)", "sampled tok/s", "ratio",
                  "same tokens as the env path"], rows_out),
        "",
        f"**Gateway rollout / env rollout, sampled tok/s on the same episodes: "
        f"{ip['ratio']:.2f}x** (Chat Completions, the agent's client in-process, "
        f"`AgentRunner`'s default; each repetition against the env run before it: "
        f"{ip['spread']}); **Responses API {rs['ratio']:.2f}x** with the whole input each "
        f"call ({rs['spread']}), {rc['ratio']:.2f}x chained by previous_response_id "
        f"({rc['spread']}), and {rp['ratio']:.2f}x with the whole input when the openai SDK's "
        f"request transform is replaced by a plain dump ({rp['spread']}; a diagnostic: the "
        f"same body and tokens, so the difference to {rs['ratio']:.2f}x is the agent's "
        f"client, not the route); **Messages API {ms['ratio']:.2f}x** ({ms['spread']}); Chat "
        f"Completions over HTTP on loopback "
        f"{hp['ratio']:.2f}x ({hp['spread']}); {ip['calls']} model calls per path; "
        f"infra-failed agent episodes: {failed}.",
        "",
        f"Each turn of all {args.episodes} episodes costs {ip['per_round_ms']:.0f} ms more "
        f"through Chat Completions, {rs['per_round_ms']:.0f} ms through the Responses API "
        f"({rc['per_round_ms']:.0f} ms chained, {rp['per_round_ms']:.0f} ms without the SDK's "
        f"transform) and {ms['per_round_ms']:.0f} ms through the "
        f"Messages API in-process, and "
        f"{hp['per_round_ms']:.0f} ms more over HTTP, than the env path "
        "((gateway wall - env wall) / turns): the agent's client (building and "
        "serializing the request, parsing the reply; the openai client's request transform "
        "walks every input item through the Responses API's union of item types, so a "
        "Responses agent that resends its whole input pays for its length on every call), "
        "the gateway's request validation and "
        "translation, "
        "the delta rendered from the messages, decoding and parsing the reply, and over HTTP "
        "the sockets, both ends' HTTP parsing and the hop to the server's thread. As in a "
        "rollout worker, the episodes run on the engine's event loop, the startup heap is "
        "frozen out of the garbage collector, and the engine core's model leaves one CPU to "
        "the episodes (`rollout.engine.cpu_threads`).",
        "",
    ])
    benchlib.write_result(args.output, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
