"""The scripted policies the dry run plays every sampled task with: the env's oracle and the
bad ones a model makes early in training (no call, an unknown tool, missing or random
arguments, random text). The compact vocabulary of a run (`toolrl.trainer.warm_start`
``task_vocab_texts``) plays them too, so their observations stay within it."""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Mapping
from typing import Any

from toolrl.core.types import ToolCall

__all__ = ["BAD_POLICIES", "Policy", "oracle_policy"]

Policy = Callable[[Any, list[dict[str, Any]], random.Random], str]


def _no_call(env: Any, messages: list[dict[str, Any]], rng: random.Random) -> str:
    return "I am not sure."


def _unknown_tool(env: Any, messages: list[dict[str, Any]], rng: random.Random) -> str:
    return env.unwrapped.render_calls([ToolCall("no_such_tool", {"x": 1})])


def _no_arguments(env: Any, messages: list[dict[str, Any]], rng: random.Random) -> str:
    tools = env.unwrapped.tools_schema()
    name = tools[0]["function"]["name"] if tools else "no_such_tool"
    return env.unwrapped.render_calls([ToolCall(name, {})])


def _random_arguments(env: Any, messages: list[dict[str, Any]], rng: random.Random) -> str:
    tools = env.unwrapped.tools_schema()
    if not tools:
        return _no_call(env, messages, rng)
    fn = rng.choice(tools)["function"]
    params = fn.get("parameters") or {}
    required = set(params.get("required") or [])
    args = {k: _random_value(v, rng) for k, v in (params.get("properties") or {}).items()
            if k in required or rng.random() < 0.5}
    return env.unwrapped.render_calls([ToolCall(fn["name"], args)])


def _random_text(env: Any, messages: list[dict[str, Any]], rng: random.Random) -> str:
    return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 40)))


BAD_POLICIES: dict[str, Policy] = {
    "no_call": _no_call, "unknown_tool": _unknown_tool, "no_arguments": _no_arguments,
    "random_arguments": _random_arguments, "random_text": _random_text,
}
"""The scripted bad policies every sampled task is also played with (name -> policy)."""


def oracle_policy(env: Any, messages: list[dict[str, Any]], rng: random.Random) -> str:
    return env.unwrapped.oracle_action()


def _random_value(schema: Any, rng: random.Random) -> Any:
    if not isinstance(schema, Mapping):
        return "x"
    if schema.get("enum"):
        return rng.choice(list(schema["enum"]))
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "integer":
        return rng.randint(-10, 100)
    if kind == "number":
        return round(rng.uniform(-10, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [_random_value(schema.get("items"), rng) for _ in range(rng.randint(0, 2))]
    if kind == "object":
        return {}
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 8)))


