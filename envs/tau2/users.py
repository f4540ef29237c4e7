"""The user side of a tau2 episode: tau2's own user classes, chosen by configuration.

- ``scripted`` (tests, oracle, CPU runs): `ScriptedUser`, a tau2 ``BaseUser`` that states the
  task's instructions (``str(task.user_scenario)``, what tau2 gives its simulator) as its first
  message and ends the conversation (``###STOP###``) at the agent's next text message.
- ``solo`` (domains where tau2 defines it: telecom, mock): tau2's ``DummyUser``; the agent gets
  the ticket and the user's tools, and ends with the ``done`` tool.
- ``llm``: tau2's ``UserSimulator`` (litellm) against any OpenAI-compatible endpoint:
  ``user_model="openai/<name>"``, ``user_base_url="http://host:port/v1"``.
"""

from __future__ import annotations

from typing import Any

from tau2.data_model.message import Message, UserMessage
from tau2.data_model.tasks import Task
from tau2.environment.environment import Environment
from tau2.user.base import STOP, BaseUser, UserState
from tau2.user.user_simulator import DummyUser, UserSimulator

USER_KINDS = ("scripted", "solo", "llm")


class ScriptedUser(BaseUser):
    """States the task's instructions, then stops at the agent's next text message."""

    def get_init_state(self, message_history: list[Message] | None = None) -> UserState:
        self.spoken = False  # (a task's message history may hold earlier user lines)
        return UserState(system_messages=[], messages=list(message_history or []))

    def generate_next_message(self, message: Any, state: UserState
                              ) -> tuple[UserMessage, UserState]:
        state.messages.append(message)
        reply = UserMessage(role="user", content=STOP if self.spoken else str(self.instructions))
        self.spoken = True
        state.messages.append(reply)
        return reply, state

    @classmethod
    def is_stop(cls, message: UserMessage) -> bool:
        return UserSimulator.is_stop(message)

    def set_seed(self, seed: int) -> None:
        pass


def make_user(kind: str, task: Task, environment: Environment, *, model: str | None = None,
              base_url: str | None = None, api_key: str | None = None,
              llm_args: dict[str, Any] | None = None) -> BaseUser:
    """The tau2 user for one episode (tau2's ``run_task`` builds its user the same way)."""
    if kind == "solo":
        return DummyUser()
    if kind == "scripted":
        return ScriptedUser(instructions=str(task.user_scenario))
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
