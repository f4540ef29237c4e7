"""The user side of a tau2 episode: tau2's own user classes, chosen by configuration.

- ``scripted`` (tests, oracle, CPU runs): `ScriptedUser`, a tau2 ``BaseUser`` that states the
  task's instructions (``str(task.user_scenario)``, what tau2 gives its simulator) as its first
  message. Where the user has tools (telecom's phone: tau2's dual control) it does what the
  agent's text asks in the form tau2's policy and ground-truth agent write it, a call of a user
  tool such as ``toggle_airplane_mode()`` or ``grant_app_permission(app_name="messaging",
  permission="sms")``: it makes those calls (tau2 user tool calls, run by the orchestrator /
  the env against the user's device) and answers with their results. It ends the conversation
  (``###STOP###``) at the first agent text that asks it to do nothing.
- ``solo`` (domains where tau2 defines it: telecom, mock): tau2's ``DummyUser``; the agent gets
  the ticket and the user's tools, and ends with the ``done`` tool.
- ``llm``: tau2's ``UserSimulator`` (litellm) against any OpenAI-compatible endpoint:
  ``user_model="openai/<name>"``, ``user_base_url="http://host:port/v1"``.
- ``engine``: `EngineUser`, tau2's ``UserSimulator`` (its system prompt: the simulation
  guidelines and the task's scenario; its state, role flip and user tool calls) whose model is
  the rollout's own engine (``env.rollout_model``, the policy's current weights): no endpoint,
  no second model. Its text reaches the agent as the user's message, an observation: its tokens
  never train (mask 0). Inside a toolrl rollout only (`Tau2Env` lets the scripted user stand
  in elsewhere).

``user_llm_args`` (``temperature``, ``max_tokens``, ...) go to the ``llm`` and ``engine`` users;
tau2's default is temperature 0.0 (``DEFAULT_LLM_ARGS_USER``).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from typing import Any

from tau2.config import DEFAULT_LLM_ARGS_USER
from tau2.data_model.message import (
    AssistantMessage,
    Message,
    MultiToolMessage,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from tau2.data_model.message import ToolCall as Tau2Call
from tau2.data_model.tasks import Task
from tau2.environment.environment import Environment
from tau2.environment.tool import Tool as Tau2Tool
from tau2.user.base import STOP, BaseUser, UserState
from tau2.user.user_simulator import DummyUser, UserSimulator

from toolrl import ChatModel, ToolCall, ToolCallFormat

USER_KINDS = ("scripted", "solo", "llm", "engine")
ENGINE_USER_MODEL = "toolrl/rollout-engine"  # the EngineUser's ``llm`` (tau2 records it)


class ScriptedUser(BaseUser):
    """States the task's instructions; then makes the user-tool calls an agent text asks for
    (`requested_calls`) and reports their results, or stops at a text that asks for none."""

    def __init__(self, instructions: Any = None, tool_names: Iterable[str] = ()) -> None:
        super().__init__(instructions=instructions)
        self.tool_names = frozenset(tool_names)  # the user's tools (run by the environment)

    def get_init_state(self, message_history: list[Message] | None = None) -> UserState:
        self.spoken = False  # (a task's message history may hold earlier user lines)
        self.calls_made = 0
        return UserState(system_messages=[], messages=list(message_history or []))

    def generate_next_message(self, message: Any, state: UserState
                              ) -> tuple[UserMessage, UserState]:
        if isinstance(message, MultiToolMessage | ToolMessage):  # results of its own calls
            results = message.tool_messages if isinstance(message, MultiToolMessage) \
                else [message]
            state.messages.extend(results)
            reply = UserMessage(role="user", content="\n".join(
                r.content or "Done." for r in results))
        else:
            state.messages.append(message)
            calls = requested_calls(message.content or "", self.tool_names) \
                if self.spoken else []
            if calls:
                reply = UserMessage(role="user", tool_calls=[
                    Tau2Call(id=f"user_call_{self.calls_made + i}", name=name,
                             arguments=args, requestor="user")
                    for i, (name, args) in enumerate(calls)])
                self.calls_made += len(calls)
            else:
                reply = UserMessage(role="user",
                                    content=STOP if self.spoken else str(self.instructions))
        self.spoken = True
        state.messages.append(reply)
        return reply, state

    @classmethod
    def is_stop(cls, message: UserMessage) -> bool:
        return UserSimulator.is_stop(message)

    def set_seed(self, seed: int) -> None:
        pass


def requested_calls(text: str, tools: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
    """The user-tool calls a text asks for, in order: ``name(key=value, ...)`` for a tool
    named in ``tools``, values as JSON or Python literals (``mode="4g_only"``) or bare words (tau2's
    ``Action.get_func_format``: ``mode=4g_only``). A call whose arguments do not parse is not
    made."""
    if not tools:
        return []
    names = "|".join(map(re.escape, sorted(tools, key=len, reverse=True)))
    out = []
    for match in re.finditer(rf"(?<![\w.])({names})\(([^()]*)\)", text):
        args = _call_arguments(match.group(2))
        if args is not None:
            out.append((match.group(1), args))
    return out


def _call_arguments(inner: str) -> dict[str, Any] | None:
    if not inner.strip():
        return {}
    try:
        call = ast.parse(f"f({inner})", mode="eval").body
        if not call.args:
            return {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    except (SyntaxError, ValueError):
        pass
    args: dict[str, Any] = {}
    for part in inner.split(","):
        key, eq, value = part.partition("=")
        if not eq or not key.strip().isidentifier():
            return None
        value = value.strip()
        try:
            args[key.strip()] = json.loads(value)
        except ValueError:
            args[key.strip()] = value.strip("\"'")
    return args


class EngineUser(UserSimulator):
    """tau2's ``UserSimulator`` with the rollout's engine in place of litellm.

    Everything but the model call is tau2's: the system prompt, the state, the role flip
    (``state.flip_roles()``), the tool calls' requestor. The flipped messages are shown as the
    agent's are (calls written in the env's tool-call format, tool results by name), and the
    reply is parsed with that format: the user's tools (telecom) are called as the agent's
    are. A reply that is empty, or has neither text nor a call, is returned as such (the env
    ends the conversation with tau2's ``USER_ERROR``).
    """

    def __init__(self, model: ChatModel, parser: ToolCallFormat,
                 tools: list[Tau2Tool] | None = None, instructions: Any = None,
                 llm_args: dict[str, Any] | None = None) -> None:
        super().__init__(tools=tools, instructions=instructions, llm=ENGINE_USER_MODEL,
                         llm_args={**DEFAULT_LLM_ARGS_USER, **(llm_args or {})})
        self.model = model
        self.parser = parser

    def _generate_next_message(self, message: Any, state: UserState
                               ) -> tuple[UserMessage, UserState]:
        if isinstance(message, MultiToolMessage):
            state.messages.extend(message.tool_messages)
        else:
            state.messages.append(message)
        args = dict(self.llm_args)
        text = self.model.chat(chat_messages(state.system_messages + state.flip_roles(),
                                             self.parser),
                               [t.openai_schema for t in self.tools] if self.tools else None,
                               temperature=args.pop("temperature", None),
                               max_tokens=args.pop("max_tokens", None))
        calls = []
        content = text
        if self.tools:
            parse = self.parser.parse(text)
            calls = [Tau2Call(id=f"user_call_{len(state.messages)}_{i}", name=c.name,
                              arguments=c.arguments if isinstance(c.arguments, dict) else {},
                              requestor="user") for i, c in enumerate(parse.calls)]
            if calls:
                content = parse.text
        reply = UserMessage(role="user", content=content.strip() or None,
                            tool_calls=calls or None)
        state.messages.append(reply)
        return reply, state


def chat_messages(messages: list[Any], parser: ToolCallFormat) -> list[dict[str, Any]]:
    """tau2 messages as toolrl chat messages: calls written in ``parser``'s format, tool
    results with their tool's name (as `toolrl.envs.tau2.env.Tau2Env` shows the agent its
    own conversation)."""
    names = {c.id: c.name for m in messages for c in getattr(m, "tool_calls", None) or []}
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, ToolMessage):
            out.append({"role": "tool", "name": names.get(m.id, "tool"),
                        "content": m.content or ""})
        elif isinstance(m, AssistantMessage) and m.tool_calls:
            calls = [ToolCall(c.name, c.arguments, c.id) for c in m.tool_calls]
            out.append({"role": "assistant",
                        "content": parser.render(calls, m.content or "")})
        elif isinstance(m, SystemMessage | AssistantMessage | UserMessage):
            out.append({"role": m.role, "content": m.content or ""})
        else:
            raise TypeError(f"no chat form for a tau2 {type(m).__name__}")
    return out


def make_user(kind: str, task: Task, environment: Environment, *, model: str | None = None,
              base_url: str | None = None, api_key: str | None = None,
              llm_args: dict[str, Any] | None = None, engine: ChatModel | None = None,
              parser: ToolCallFormat | None = None) -> BaseUser:
    """The tau2 user for one episode (tau2's ``run_task`` builds its user the same way);
    ``engine`` / ``parser``: the rollout's model and the env's tool-call format (``engine``)."""
    if kind == "engine":
        if engine is None or parser is None:
            raise ValueError("tau2 user='engine' is the rollout's own engine: it runs inside a "
                             "toolrl rollout only (env.rollout_model is unset); elsewhere (the "
                             "oracle, check-env, the warm start) use user='scripted'")
        tools = environment.get_user_tools() if environment.user_tools is not None else None
        return EngineUser(engine, parser, tools=tools, instructions=str(task.user_scenario),
                          llm_args=llm_args)
    if kind == "solo":
        return DummyUser()
    if kind == "scripted":
        names = environment.user_tools.tools if environment.user_tools is not None else ()
        return ScriptedUser(instructions=str(task.user_scenario), tool_names=names)
    if kind == "llm":
        if not model:
            raise ValueError("user='llm' needs user_model (a litellm model name, e.g. "
                             "'openai/Qwen3-8B' with user_base_url for an OpenAI-compatible "
                             "endpoint)")
        args = dict(llm_args or {})
        if base_url:
            args["api_base"] = base_url
        if api_key:
            args["api_key"] = api_key
        tools = environment.get_user_tools() if environment.user_tools is not None else None
        return UserSimulator(tools=tools, instructions=str(task.user_scenario), llm=model,
                             llm_args=args)
    raise ValueError(f"unknown tau2 user {kind!r}; valid: {', '.join(USER_KINDS)}")
