"""A plain tool loop against the OpenAI client, on Calculator-v0 tasks.

The agent owns its loop and runs its tools itself; toolrl only serves the policy behind an
OpenAI-compatible endpoint and captures the tokens. Train it with ``rollout.agent``::

    PYTHONPATH=$PWD/examples/openai_agent toolrl train --config examples/openai_agent/config.yaml

The prompt and the tool schemas are the env's (``toolrl.make_env(...).reset``), so the
warm start (SFT on the env's oracle transcripts) teaches the model the format this agent
reads. Against any other OpenAI-compatible server::

    python examples/openai_agent/calculator_agent.py --base-url http://127.0.0.1:8000/v1 \\
        --model NAME --tasks 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import operator
from typing import Any

import openai

import toolrl

MODEL = "policy"  # the name the toolrl gateway serves the policy under
MAX_TURNS = 3
OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
       "div": operator.truediv, "pow": operator.pow}


def prompt(row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The task's first messages and the tools offered (as Calculator-v0 shows them)."""
    env = toolrl.make_env("toolrl/Calculator-v0")
    try:
        messages, info = env.reset(options=row)
        return list(messages), list(info["tools"])
    finally:
        env.close()


def run_tool(name: str, args: dict[str, Any]) -> str:
    """The calculator tools, here in the agent."""
    try:
        value = OPS[name](float(args["a"]), float(args["b"]))
    except Exception as e:  # an unknown tool, a missing argument, a division by zero
        return f"error: {type(e).__name__}: {e}"
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else str(value)


async def solve(client: openai.AsyncOpenAI, row: dict[str, Any],
                model: str = MODEL) -> dict[str, Any]:
    """Ask, run the calls, send the results back, until ``submit`` (or ``MAX_TURNS``)."""
    messages, tools = prompt(row)
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model=model, messages=messages,
                                                     tools=tools)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return {"success": False, "answer": None}  # answered in text: the episode ends
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            if call.function.name == "submit":
                answer = args.get("answer")
                ok = isinstance(answer, int | float) and math.isclose(
                    float(answer), float(row["ground_truth"]), rel_tol=1e-6)
                return {"success": ok, "answer": answer}
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "name": call.function.name,
                             "content": run_tool(call.function.name, args)})
    return {"success": False, "answer": None}


async def _main(args: argparse.Namespace) -> None:
    env = toolrl.make_env("toolrl/Calculator-v0")
    rows = type(env.unwrapped).make_tasks(args.tasks, seed=0, difficulty=1, style="plain")
    env.close()
    async with openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key) as client:
        results = await asyncio.gather(*(solve(client, r, args.model) for r in rows))
    for row, result in zip(rows, results, strict=True):
        print(f"{row['question']!r}: {result}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--tasks", type=int, default=4)
    asyncio.run(_main(parser.parse_args()))
