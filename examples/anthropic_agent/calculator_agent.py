"""A plain tool loop against the anthropic client (Messages API), on Calculator-v0 tasks.

The agent owns its loop and runs its tools itself; toolrl serves the policy behind an
Anthropic-compatible ``/v1/messages`` route and captures the tokens. Train it with
``rollout.agent`` and ``rollout.agent_client: anthropic``::

    PYTHONPATH=$PWD/examples/anthropic_agent toolrl train \\
        --config examples/anthropic_agent/config.yaml

The system prompt, the question and the tool schemas are the env's
(``toolrl.make_env(...).reset``), so the warm start (SFT on the env's oracle transcripts)
teaches the model the format this agent reads. Against any other Messages-API server::

    python examples/anthropic_agent/calculator_agent.py --base-url http://127.0.0.1:8000 \\
        --model NAME --tasks 4
"""

from __future__ import annotations

import argparse
import asyncio
import math
import operator
from typing import Any

import anthropic

import toolrl

MODEL = "policy"  # the name the toolrl gateway serves the policy under
MAX_TURNS = 3
MAX_TOKENS = 1024  # the training route caps each call at rollout.max_tokens_per_turn
OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
       "div": operator.truediv, "pow": operator.pow}


def prompt(row: dict[str, Any]) -> tuple[str, str, list[dict[str, Any]]]:
    """The task's system prompt, its question and the tools offered (as Calculator-v0 shows
    them), the tools in the Messages API's form."""
    env = toolrl.make_env("toolrl/Calculator-v0")
    try:
        messages, info = env.reset(options=row)
    finally:
        env.close()
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in info["tools"]]
    return messages[0]["content"], messages[1]["content"], tools


def run_tool(name: str, args: dict[str, Any]) -> str:
    """The calculator tools, here in the agent."""
    try:
        value = OPS[name](float(args["a"]), float(args["b"]))
    except Exception as e:  # an unknown tool, a missing argument, a division by zero
        return f"error: {type(e).__name__}: {e}"
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else str(value)


async def solve(client: anthropic.AsyncAnthropic, row: dict[str, Any],
                model: str = MODEL) -> dict[str, Any]:
    """Ask, run the ``tool_use`` blocks, send the ``tool_result`` blocks back, until
    ``submit`` (or ``MAX_TURNS``)."""
    system, question, tools = prompt(row)
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for _ in range(MAX_TURNS):
        reply = await client.messages.create(model=model, system=system, messages=messages,
                                             tools=tools, max_tokens=MAX_TOKENS)
        messages.append({"role": "assistant",
                         "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return {"success": False, "answer": None}  # answered in text: the episode ends
        results = []
        for use in uses:
            if use.name == "submit":
                answer = use.input.get("answer")
                ok = isinstance(answer, int | float) and math.isclose(
                    float(answer), float(row["ground_truth"]), rel_tol=1e-6)
                return {"success": ok, "answer": answer}
            results.append({"type": "tool_result", "tool_use_id": use.id,
                            "content": run_tool(use.name, dict(use.input))})
        messages.append({"role": "user", "content": results})
    return {"success": False, "answer": None}


async def _main(args: argparse.Namespace) -> None:
    env = toolrl.make_env("toolrl/Calculator-v0")
    rows = type(env.unwrapped).make_tasks(args.tasks, seed=0, difficulty=1, style="plain")
    env.close()
    async with anthropic.AsyncAnthropic(base_url=args.base_url, api_key=args.api_key) as client:
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
