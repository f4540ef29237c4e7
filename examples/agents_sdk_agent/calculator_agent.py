"""An agent written with the OpenAI Agents SDK, on its default model (the Responses API), on
Calculator-v0 tasks.

``Agent``, function tools and ``Runner.run`` as the SDK's documentation writes them; the SDK
owns the loop and runs the tools, and its default model speaks the Responses API
(``POST /v1/responses``), which toolrl's gateway serves on the policy while it captures the
tokens. Train it with ``rollout.agent``::

    PYTHONPATH=$PWD/examples/agents_sdk_agent toolrl train \\
        --config examples/agents_sdk_agent/config.yaml

The agent's instructions, the question and the tool schemas are the env's
(``toolrl.make_env(...).reset``), so the warm start (SFT on the env's oracle transcripts)
teaches the model the format this agent reads. Against any other Responses-API server::

    python examples/agents_sdk_agent/calculator_agent.py --base-url http://127.0.0.1:8000/v1 \\
        --model NAME --tasks 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import operator
from typing import Any

import openai
from agents import (
    Agent,
    FunctionTool,
    MaxTurnsExceeded,
    ModelBehaviorError,
    RunConfig,
    Runner,
    set_tracing_disabled,
)
from agents.models.openai_provider import OpenAIProvider
from agents.tool_context import ToolContext

import toolrl

MODEL = "policy"  # the name the toolrl gateway serves the policy under
MAX_TURNS = 3
OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
       "div": operator.truediv, "pow": operator.pow}

set_tracing_disabled(True)  # no trace export: nothing leaves the machine


def run_tool(name: str, args: dict[str, Any]) -> str:
    """The calculator tools, here in the agent."""
    try:
        value = OPS[name](float(args["a"]), float(args["b"]))
    except Exception as e:  # an unknown tool, a missing argument, a division by zero
        return f"error: {type(e).__name__}: {e}"
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else str(value)


def make_agent(row: dict[str, Any], submitted: dict[str, Any],
               model: str = MODEL) -> tuple[Agent, str]:
    """The task's agent (the env's instructions and tools, as function tools) and question;
    ``submit`` stops the run and records the answer in ``submitted``."""
    env = toolrl.make_env("toolrl/Calculator-v0")
    try:
        messages, info = env.reset(options=row)
    finally:
        env.close()

    def invoke(name: str):
        async def on_invoke(ctx: ToolContext[Any], arguments: str) -> str:
            args = json.loads(arguments or "{}")
            if name == "submit":
                submitted["answer"] = args.get("answer")
                return "submitted"
            return run_tool(name, args)
        return on_invoke

    tools = [FunctionTool(name=f["name"], description=f.get("description", ""),
                          params_json_schema=f["parameters"], on_invoke_tool=invoke(f["name"]),
                          strict_json_schema=False)  # the env's schemas, as the model saw them
             for f in (t["function"] for t in info["tools"])]
    agent = Agent(name="calculator", instructions=messages[0]["content"], tools=tools,
                  model=model, tool_use_behavior={"stop_at_tool_names": ["submit"]})
    return agent, messages[1]["content"]


async def solve(client: openai.AsyncOpenAI, row: dict[str, Any],
                model: str = MODEL) -> dict[str, Any]:
    """One ``Runner.run`` of the task's agent on ``client`` (the SDK's default model, the
    Responses API); success if it submitted the right answer."""
    submitted: dict[str, Any] = {}
    agent, question = make_agent(row, submitted, model)
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client),
                       tracing_disabled=True)
    # out of turns, a call of an unknown tool: the policy's doing, the task unsolved
    with contextlib.suppress(MaxTurnsExceeded, ModelBehaviorError):
        await Runner.run(agent, question, max_turns=MAX_TURNS, run_config=config)
    answer = submitted.get("answer")
    ok = isinstance(answer, int | float) and not isinstance(answer, bool) and math.isclose(
        float(answer), float(row["ground_truth"]), rel_tol=1e-6)
    return {"success": ok, "answer": answer}


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
