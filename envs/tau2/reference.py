"""tau2's own score of a fixed agent script, for checking `Tau2Env` against tau2.

`tau2_reward` runs the script through tau2 alone: tau2's ``Orchestrator`` (its ``run``) with a
replay agent (a subclass of tau2's ``LLMAgent`` / ``LLMSoloAgent`` whose next message is the
script's next step instead of an LLM's), the same tau2 user as the env (`ScriptedUser`, or
``DummyUser`` in solo mode), tau2's domain environment, and ``evaluate_simulation``. toolrl
takes no part in it, so the env's reward can be compared with it: they must be equal.

A script is a list of steps: a string (a text message) or a list of ``(name, arguments)``
calls (one assistant message).
"""

from __future__ import annotations

import random
from typing import Any

from tau2.agent.llm_agent import LLMAgent, LLMSoloAgent
from tau2.data_model.message import AssistantMessage, MultiToolMessage, ToolCall
from tau2.data_model.simulation import RewardInfo
from tau2.data_model.tasks import Task
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.orchestrator.orchestrator import Orchestrator
from tau2.registry import registry

from .users import make_user

Step = str | list[tuple[str, dict[str, Any]]]


def _message(step: Step, index: int) -> AssistantMessage:
    if isinstance(step, str):
        return AssistantMessage(role="assistant", content=step)
    calls = [ToolCall(id=f"ref_{index}_{i}", name=name, arguments=dict(args),
                      requestor="assistant") for i, (name, args) in enumerate(step)]
    return AssistantMessage(role="assistant", tool_calls=calls)


def _next(agent: Any, message: Any, state: Any) -> tuple[AssistantMessage, Any]:
    if isinstance(message, MultiToolMessage):
        state.messages.extend(message.tool_messages)
    elif message is not None:
        state.messages.append(message)
    index = agent.position
    step = agent.script[min(index, len(agent.script) - 1)]
    agent.position += 1
    reply = _message(step, index)
    if isinstance(agent, LLMSoloAgent) and reply.tool_calls:
        reply = agent._check_if_stop_toolcall(reply)
    state.messages.append(reply)
    return reply, state


class ReplayAgent(LLMAgent):
    """tau2's LLMAgent with the script in place of the LLM."""

    def __init__(self, *args: Any, script: list[Step], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.script, self.position = list(script), 0

    def generate_next_message(self, message: Any, state: Any) -> tuple[AssistantMessage, Any]:
        return _next(self, message, state)


class ReplaySoloAgent(LLMSoloAgent):
    """tau2's LLMSoloAgent with the script in place of the LLM."""

    def __init__(self, *args: Any, script: list[Step], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.script, self.position = list(script), 0

    def generate_next_message(self, message: Any, state: Any) -> tuple[AssistantMessage, Any]:
        return _next(self, message, state)


def tau2_reward(domain: str, task: Task, script: list[Step], *, solo: bool = False,
                max_steps: int = 100, max_errors: int = 10) -> RewardInfo:
    """tau2's reward for the agent that sends ``script`` (as tau2's ``run_task`` wires it)."""
    constructor = registry.get_env_constructor(domain)
    environment = constructor(solo_mode=True) if solo else constructor()
    if solo:
        user_tools = environment.get_user_tools() if environment.user_tools else []
        agent: Any = ReplaySoloAgent(tools=environment.get_tools() + user_tools,
                                     domain_policy=environment.get_policy(), task=task,
                                     script=script)
    else:
        agent = ReplayAgent(tools=environment.get_tools(),
                            domain_policy=environment.get_policy(), script=script)
    user = make_user("solo" if solo else "scripted", task, environment)
    simulation = Orchestrator(domain=domain, agent=agent, user=user, environment=environment,
                              task=task, max_steps=max_steps, max_errors=max_errors,
                              solo_mode=solo).run()
    return evaluate_simulation(simulation=simulation, task=task,
                               evaluation_type=EvaluationType.ALL, solo_mode=solo,
                               domain=domain)


def gold_script(task: Task, *, solo: bool = False) -> list[Step]:
    """The task's gold actions (one call a message; user actions only in solo mode, where the
    agent has the user's tools), then its communicate info (or, solo, the ``done`` tool)."""
    criteria = task.evaluation_criteria
    actions = [a for a in (criteria.actions if criteria else None) or []
               if a.requestor == "assistant" or solo]
    script: list[Step] = [[(a.name, dict(a.arguments))] for a in actions]
    if solo:
        script.append([(LLMSoloAgent.STOP_FUNCTION_NAME, {})])
    else:
        info = (criteria.communicate_info if criteria else None) or []
        script.append(" ".join(["Done.", *map(str, info)]))
    return script


def variants(task: Task, pool: dict[str, list[dict[str, Any]]], rng: random.Random, *,
             solo: bool = False, tools: list[str] | None = None) -> list[tuple[str, list[Step]]]:
    """Scripts around the gold one: gold; a step dropped; two steps swapped; a wrong argument;
    two calls in one message; no communicate info; random valid calls (tools called with the
    arguments of gold calls of the domain, ``pool``)."""
    gold = gold_script(task, solo=solo)
    calls, last = gold[:-1], gold[-1]
    out: list[tuple[str, list[Step]]] = [("gold", gold)]
    if calls:
        k = rng.randrange(len(calls))
        out.append(("dropped", calls[:k] + calls[k + 1:] + [last]))
    if len(calls) >= 2:
        k = rng.randrange(len(calls) - 1)
        swapped = list(calls)
        swapped[k], swapped[k + 1] = swapped[k + 1], swapped[k]
        out.append(("swapped", [*swapped, last]))
        merged = [*calls[:k], calls[k] + calls[k + 1], *calls[k + 2:], last]
        out.append(("parallel", merged))
    with_args = [i for i, s in enumerate(calls) if s[0][1]]
    if with_args:
        i = rng.choice(with_args)
        name, args = calls[i][0]
        key = rng.choice(sorted(args))
        args = {**args, key: _wrong(args[key], rng)}
        out.append(("wrong_arg", [*calls[:i], [(name, args)], *calls[i + 1:], last]))
    if not solo:
        out.append(("silent", [*calls, "Done."]))
    names = [n for n in (tools or sorted(pool)) if pool.get(n)]
    if names:
        randoms = [[(n, dict(rng.choice(pool[n])))] for n in
                   (rng.choice(names) for _ in range(rng.randint(1, 4)))]
        out.append(("random", [*randoms, last]))
    return out


def _wrong(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    if isinstance(value, dict):
        return {}
    return None


def argument_pool(tasks: list[Task], *, solo: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Every gold call's arguments, by tool name."""
    pool: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        criteria = task.evaluation_criteria
        for a in (criteria.actions if criteria else None) or []:
            if a.requestor == "assistant" or solo:
                pool.setdefault(a.name, []).append(dict(a.arguments))
    return pool


def env_episode(env: Any, row: dict[str, Any], script: list[Step]) -> Any:
    """The same script played through a toolrl `Tau2Env` (its `Trajectory`)."""
    import asyncio

    from toolrl import ToolCall as Call
    from toolrl import run_episode

    base = env.unwrapped

    def policy(_env: Any, _messages: Any) -> str:
        step = script[min(base.turn, len(script) - 1)]
        if isinstance(step, str):
            return step
        return base.render_calls([Call(name, dict(args)) for name, args in step])

    return asyncio.run(run_episode(env, policy, row=row, max_steps=10_000))
