"""Agents for the gateway tests (``rollout.agent: "tests.rollout.gateway_agents:X"``).

The tiny model has random weights: the submitting agent forces a ``submit`` call with a named
``tool_choice`` (constrained decoding), so reward plugins have a call to score.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

from pydantic import Field

from toolrl import make_env

MODEL = "policy"
Small = Annotated[int, Field(ge=0, le=20)]  # bounded, so the random model's digits end
INFLIGHT = {"now": 0, "max": 0}


def _tools(row):
    env = make_env("toolrl/Calculator-v0")
    try:
        messages, info = env.reset(options=row)
        tools = [t for t in info["tools"] if t["function"]["name"] == "submit"]
        for t in tools:  # bounded, so the random model's digits end
            t["function"]["parameters"]["properties"]["answer"] = {
                "type": "integer", "minimum": 0, "maximum": 20}
        return messages, tools
    finally:
        env.close()


async def submit_once(client, row):
    """One call, forced to ``submit``; returns the tool's verdict as the episode's info."""
    messages, tools = _tools(row)
    INFLIGHT["now"] += 1
    INFLIGHT["max"] = max(INFLIGHT["max"], INFLIGHT["now"])
    try:
        r = await client.chat.completions.create(
            model=MODEL, messages=messages, tools=tools, max_tokens=90,
            tool_choice={"type": "function", "function": {"name": "submit"}})
        await asyncio.sleep(0.05)
    finally:
        INFLIGHT["now"] -= 1
    call = r.choices[0].message.tool_calls[0]
    return {"submitted": call.function.arguments}


class TwoTurns:
    """A class agent: a text turn, then a user nudge, then the forced submit."""

    async def solve(self, client, row):
        messages, tools = _tools(row)
        first = await client.chat.completions.create(model=MODEL, messages=messages,
                                                     tools=tools, tool_choice="none",
                                                     max_tokens=6)
        messages = [*messages, first.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": "Now submit."}]
        await client.chat.completions.create(
            model=MODEL, messages=messages, tools=tools, max_tokens=90,
            tool_choice={"type": "function", "function": {"name": "submit"}})


async def summarizes(client, row):
    """Rewrites its history between two calls: two samples of one episode."""
    messages, tools = _tools(row)
    await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6)
    summary = [messages[0], {"role": "user", "content": f"Summary: {row['question']}"}]
    await client.chat.completions.create(
        model=MODEL, messages=summary, tools=tools, max_tokens=90,
        tool_choice={"type": "function", "function": {"name": "submit"}})


async def raises(client, row):
    await client.chat.completions.create(model=MODEL, max_tokens=2,
                                         messages=[{"role": "user", "content": "hi"}])
    raise RuntimeError("the agent's own bug")


async def hangs(client, row):
    await asyncio.sleep(3600)


async def never_calls(client, row):
    return {"success": True}


def not_async(client, row):
    return None


async def chatty(client, row):
    """Talks until the conversation outgrows the budget (the client raises on the 400)."""
    messages, tools = _tools(row)
    for _ in range(50):
        r = await client.chat.completions.create(model=MODEL, messages=messages, tools=tools,
                                                 tool_choice="none")
        messages = [*messages, r.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": "Tell me more."}]


async def straggles(client, row):
    """``submit_once``, but training tasks whose id ends in 0 or 5 first wait 60 s (a slow
    tool): the async trainer's ``stale_policy: drop`` must give up on them, not wait."""
    if "train" in str(row["id"]) and str(row["id"])[-1] in "05":
        await asyncio.sleep(60)
    return await submit_once(client, row)


async def agents_sdk(client, row):
    """The OpenAI Agents SDK (``Agent``, ``function_tool``, ``Runner.run``) on the gateway's
    client: one run forces an ``add`` call and runs the tool (the SDK sends the result with
    ``tool_call_id`` and no ``name``); a second run on that history forces another call with
    room for 16 tokens (a whole call takes more), so its reply is cut inside the call and
    fails to parse."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    set_tracing_disabled(True)  # no trace export: nothing leaves the machine

    @function_tool
    def add(a: Small, b: Small) -> int:
        """Add two integers."""
        return a + b

    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    first = Agent(name="calc", instructions="Use the tools.", tools=[add], model=model,
                  model_settings=ModelSettings(tool_choice="add", max_tokens=90),
                  tool_use_behavior="stop_on_first_tool")
    done = await Runner.run(first, str(row["question"]), max_turns=2)
    cut = first.clone(model_settings=ModelSettings(tool_choice="add", max_tokens=16),
                      tool_use_behavior="run_llm_again")
    again = await Runner.run(cut, done.to_input_list(), max_turns=1)
    return {"answer": str(again.final_output)}


def _bounded(tools, answer_max=20):
    """The env's tools with small integer arguments (so the random model's digits end)."""
    for t in tools:
        props = t["function"]["parameters"]["properties"]
        for key in props:
            props[key] = {"type": "integer", "minimum": 0, "maximum": answer_max}
    return tools


def _run_calculator_tool(name, args):
    ops = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}
    return str(ops[name](args["a"], args["b"])) if name in ops else "error: unknown tool"


async def responses_tool_loop(client, row):
    """The Responses API through the openai client: a forced ``add`` call, its result sent
    back after ``previous_response_id``, then a forced ``submit``."""
    env = make_env("toolrl/Calculator-v0")
    try:
        messages, info = env.reset(options=row)
    finally:
        env.close()
    tools = [{"type": "function", **t["function"]} for t in _bounded(info["tools"])]
    first = await client.responses.create(
        model=MODEL, instructions=messages[0]["content"], input=messages[1]["content"],
        tools=tools, tool_choice={"type": "function", "name": "add"}, max_output_tokens=90)
    [call] = [item for item in first.output if item.type == "function_call"]
    result = _run_calculator_tool(call.name, json.loads(call.arguments))
    final = await client.responses.create(
        model=MODEL, instructions=messages[0]["content"], previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": result}],
        tools=tools, tool_choice={"type": "function", "name": "submit"}, max_output_tokens=90,
        stream=True)
    events = [e async for e in final]
    [submit] = [item for item in events[-1].response.output if item.type == "function_call"]
    return {"answer": json.loads(submit.arguments)["answer"], "events": len(events)}


async def anthropic_tool_loop(client, row):
    """Anthropic's Messages API through the anthropic client: a forced ``add`` call, its
    ``tool_result``, then a forced ``submit`` (streamed)."""
    env = make_env("toolrl/Calculator-v0")
    try:
        messages, info = env.reset(options=row)
    finally:
        env.close()
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in _bounded(info["tools"])]
    history = [{"role": "user", "content": messages[1]["content"]}]
    first = await client.messages.create(
        model=MODEL, system=messages[0]["content"], messages=history, tools=tools,
        tool_choice={"type": "tool", "name": "add"}, max_tokens=90)
    assert first.stop_reason == "tool_use", first
    [use] = [b for b in first.content if b.type == "tool_use"]
    history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                  for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                              "content": _run_calculator_tool(use.name,
                                                                              use.input)}]}]
    async with client.messages.stream(
            model=MODEL, system=messages[0]["content"], messages=history, tools=tools,
            tool_choice={"type": "tool", "name": "submit"}, max_tokens=90) as stream:
        final = await stream.get_final_message()
    [submit] = [b for b in final.content if b.type == "tool_use"]
    return {"answer": submit.input["answer"], "stop_reason": final.stop_reason}


async def agents_sdk_responses(client, row):
    """The OpenAI Agents SDK on its default model (the Responses API, through
    ``OpenAIProvider``): a forced ``add`` that the SDK runs, then, streamed, a forced
    ``submit`` on that history."""
    from agents import (
        Agent,
        ModelSettings,
        RunConfig,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.models.openai_provider import OpenAIProvider
    set_tracing_disabled(True)  # no trace export: nothing leaves the machine

    @function_tool
    def add(a: Small, b: Small) -> int:
        """Add two integers."""
        return a + b

    @function_tool
    def submit(answer: Small) -> str:
        """Submit the answer."""
        return "submitted"

    config = RunConfig(model_provider=OpenAIProvider(openai_client=client),
                       tracing_disabled=True)
    first = Agent(name="calc", instructions="Use the tools.", tools=[add, submit], model=MODEL,
                  model_settings=ModelSettings(tool_choice="add", max_tokens=90),
                  tool_use_behavior="stop_on_first_tool")
    done = await Runner.run(first, str(row["question"]), max_turns=2, run_config=config)
    final = first.clone(model_settings=ModelSettings(tool_choice="submit", max_tokens=90))
    streamed = Runner.run_streamed(final, done.to_input_list(), max_turns=2,
                                   run_config=config)
    async for _ in streamed.stream_events():
        pass
    return {"answer": str(streamed.final_output)}
