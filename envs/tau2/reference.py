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

import json
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


class _Replay:
    """The script in place of the LLM: the next message is the script's next step (its last
    step again once it is played out). Mixed into tau2's agents, before them."""

    def __init__(self, *args: Any, script: list[Step], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.script, self.position = list(script), 0

    def generate_next_message(self, message: Any, state: Any) -> tuple[AssistantMessage, Any]:
        if isinstance(message, MultiToolMessage):
            state.messages.extend(message.tool_messages)
        elif message is not None:
            state.messages.append(message)
        index = self.position
        step = self.script[min(index, len(self.script) - 1)]
        self.position += 1
        reply = _message(step, index)
        if isinstance(self, LLMSoloAgent):  # as LLMSoloAgent.generate_next_message
            if not reply.is_tool_call():
                raise ValueError("LLMSoloAgent only supports tool calls.")
            reply = self._check_if_stop_toolcall(reply)
        state.messages.append(reply)
        return reply, state


class ReplayAgent(_Replay, LLMAgent):
    """tau2's LLMAgent with the script in place of the LLM."""


class ReplaySoloAgent(_Replay, LLMSoloAgent):
    """tau2's LLMSoloAgent with the script in place of the LLM."""


def tau2_reward(domain: str, task: Task, script: list[Step], *, solo: bool = False,
                max_steps: int = 100, max_errors: int = 10) -> RewardInfo:
    """tau2's reward for the agent that sends ``script`` (as tau2's ``run_task`` wires it).
    A simulation that raises (e.g. a solo agent's text reply, which ``LLMSoloAgent`` refuses)
    scores 0.0 with the error under ``info["failed_sample"]``, as tau2's ``run_tasks`` scores
    a failed sample with ``skip_failed_samples``."""
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
    try:
        simulation = Orchestrator(domain=domain, agent=agent, user=user,
                                  environment=environment, task=task, max_steps=max_steps,
                                  max_errors=max_errors, solo_mode=solo).run()
    except Exception as exc:  # as run_tasks scores a failed sample (skip_failed_samples)
        return RewardInfo(reward=0.0, info={"failed_sample": f"{type(exc).__name__}: {exc}"})
    return evaluate_simulation(simulation=simulation, task=task,
                               evaluation_type=EvaluationType.ALL, solo_mode=solo,
                               domain=domain)


Action = tuple[str, str, dict[str, Any]]  # (requestor, tool name, arguments)


def gold_actions(task: Task, *, solo: bool = False) -> list[Action]:
    """The task's gold actions in order; in solo mode the agent makes the user's too."""
    criteria = task.evaluation_criteria
    return [("assistant" if solo else a.requestor, a.name, dict(a.arguments))
            for a in (criteria.actions if criteria else None) or []]


def render_steps(actions: list[list[Action]]) -> list[Step]:
    """One message per group of actions: the agent's calls, or one text asking the user to
    make theirs (`user_request`). A group mixes no requestors."""
    return [[(n, args) for _, n, args in group] if group[0][0] == "assistant" else
            " ".join(user_request(n, args) for _, n, args in group) for group in actions]


def closing_step(task: Task, *, solo: bool = False) -> Step:
    """The oracle's last message: the ``done`` tool (solo), else the communicate info."""
    if solo:
        return [(LLMSoloAgent.STOP_FUNCTION_NAME, {})]
    criteria = task.evaluation_criteria
    info = (criteria.communicate_info if criteria else None) or []
    return " ".join(["Done.", *map(str, info)])


def gold_script(task: Task, *, solo: bool = False) -> list[Step]:
    """The task's gold actions in order, one a message, then its communicate info (or, solo,
    the ``done`` tool). The agent's actions are calls; the user's (telecom's phone) are, in
    solo mode, calls too (the agent has the user's tools), else a text asking the user to make
    the call (`user_request`), as tau2's ground-truth agent instructs the user."""
    return [*render_steps([[a] for a in gold_actions(task, solo=solo)]),
            closing_step(task, solo=solo)]


def user_request(name: str, arguments: dict[str, Any]) -> str:
    """The agent's text asking the user to make a call on their device: the call written as
    tau2's telecom policy writes it (``grant_app_permission(app_name="messaging", ...)``),
    which `toolrl.envs.tau2.users.ScriptedUser` follows."""
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in arguments.items())
    return f"Please do this on your phone: {name}({args})."


# a read-only call per domain (and mode), to pad a message to many calls
FILLER: dict[tuple[str, bool], tuple[str, dict[str, Any]]] = {
    ("mock", False): ("get_users", {}), ("mock", True): ("get_users", {}),
    ("airline", False): ("list_all_airports", {}),
    ("retail", False): ("list_all_product_types", {}),
    ("telecom", False): ("get_customer_by_phone", {"phone_number": "555-123-2002"}),
    ("telecom", True): ("check_status_bar", {})}


def variants(task: Task, pool: dict[str, list[dict[str, Any]]], rng: random.Random, *,
             solo: bool = False, tools: list[str] | None = None,
             domain: str | None = None) -> list[tuple[str, list[Step]]]:
    """Scripts around the gold one: gold; a step dropped; two steps swapped; a wrong argument;
    two actions of one requestor in one message; forty calls in one message (the first gold
    call of the agent after 39 read-only calls of the ``domain``, `FILLER`); no communicate
    info (solo: ``###STOP###`` as text instead of the ``done`` tool); random valid calls
    (agent tools called with the arguments of gold calls of the domain, ``pool``)."""
    steps = [[a] for a in gold_actions(task, solo=solo)]
    last = closing_step(task, solo=solo)

    def script(groups: list[list[Action]]) -> list[Step]:
        return [*render_steps(groups), last]

    out: list[tuple[str, list[Step]]] = [("gold", script(steps))]
    if steps:
        k = rng.randrange(len(steps))
        out.append(("dropped", script(steps[:k] + steps[k + 1:])))
    if len(steps) >= 2:
        k = rng.randrange(len(steps) - 1)
        swapped = list(steps)
        swapped[k], swapped[k + 1] = swapped[k + 1], swapped[k]
        out.append(("swapped", script(swapped)))
        pairs = [i for i in range(len(steps) - 1) if steps[i][0][0] == steps[i + 1][0][0]]
        if pairs:
            k = rng.choice(pairs)
            out.append(("parallel", script([*steps[:k], steps[k] + steps[k + 1],
                                            *steps[k + 2:]])))
    with_args = [i for i, s in enumerate(steps) if s[0][2]]
    if with_args:
        i = rng.choice(with_args)
        requestor, name, args = steps[i][0]
        key = rng.choice(sorted(args))
        args = {**args, key: _wrong(args[key], rng)}
        out.append(("wrong_arg", script([*steps[:i], [(requestor, name, args)],
                                         *steps[i + 1:]])))
    filler = FILLER.get((domain, solo)) if domain else None
    own = [i for i, s in enumerate(steps) if s[0][0] == "assistant"]
    if filler and own:
        k = own[0]
        padded = [("assistant", *filler)] * 39 + steps[k]
        out.append(("forty_calls", script([*steps[:k], padded, *steps[k + 1:]])))
    if solo:  # the stop as text, not the `done` tool: tau2's solo agent refuses it
        out.append(("text_stop", [*render_steps(steps), LLMSoloAgent.STOP_TOKEN]))
    else:
        out.append(("silent", [*render_steps(steps), "Done."]))
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
