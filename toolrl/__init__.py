"""toolrl: reinforcement learning of tool-calling language models.

The public API is re-exported here; everything else is reachable by module path. Env-related
names are loaded lazily (``import toolrl`` stays light for Ray workers).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from toolrl.registry import Registry, RegistryError

if TYPE_CHECKING:
    from toolrl.core.env import Episode, ToolEnv, run_episode
    from toolrl.core.parse import get_format
    from toolrl.core.registration import env_ids, make_env, register_env
    from toolrl.core.tools import Tool, ToolFailure, tool
    from toolrl.core.types import ParseResult, ToolCall
    from toolrl.core.wrappers import MaxTurns, ObservationBudget, ToolTimeout, ToolWrapper

__version__ = "0.1.0"

_LAZY = {
    "ToolEnv": "toolrl.core.env", "Episode": "toolrl.core.env", "run_episode": "toolrl.core.env",
    "get_format": "toolrl.core.parse",
    "register_env": "toolrl.core.registration", "make_env": "toolrl.core.registration",
    "env_ids": "toolrl.core.registration",
    "Tool": "toolrl.core.tools", "ToolFailure": "toolrl.core.tools", "tool": "toolrl.core.tools",
    "ToolCall": "toolrl.core.types", "ParseResult": "toolrl.core.types",
    "MaxTurns": "toolrl.core.wrappers", "ObservationBudget": "toolrl.core.wrappers",
    "ToolTimeout": "toolrl.core.wrappers", "ToolWrapper": "toolrl.core.wrappers",
}

__all__ = [
    "Episode", "MaxTurns", "ObservationBudget", "ParseResult", "Registry", "RegistryError", "Tool",
    "ToolCall", "ToolEnv", "ToolFailure", "ToolTimeout", "ToolWrapper", "__version__", "env_ids",
    "get_format", "make_env", "register_env", "run_episode", "tool",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'toolrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
