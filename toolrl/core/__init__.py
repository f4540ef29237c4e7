"""Core of toolrl: tool envs, tools, tool-call parsing, reward API (no Ray, no trainer).

Names are re-exported lazily, so ``import toolrl.core.types`` (used by rewards) does not pull
in gymnasium or jsonschema.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolrl.core.env import (
        BackgroundLoop,
        Episode,
        MessagesSpace,
        OracleUnavailable,
        ToolEnv,
        Turn,
        oracle_policy,
        resolve_astep,
        run_episode,
    )
    from toolrl.core.parse import FORMATS, ToolCallFormat, get_format
    from toolrl.core.registration import ENVS, env_ids, make_env, register_env
    from toolrl.core.tools import Tool, ToolFailure, ToolResult, tool
    from toolrl.core.types import ERROR_TYPES, ParseError, ParseResult, ToolCall
    from toolrl.core.wrappers import MaxTurns, ObservationBudget, ToolTimeout, ToolWrapper

_EXPORTS = {
    "toolrl.core.env": ["BackgroundLoop", "Episode", "MessagesSpace", "OracleUnavailable",
                        "ToolEnv", "Turn", "oracle_policy", "resolve_astep", "run_episode"],
    "toolrl.core.parse": ["FORMATS", "ToolCallFormat", "get_format"],
    "toolrl.core.registration": ["ENVS", "env_ids", "make_env", "register_env"],
    "toolrl.core.tools": ["Tool", "ToolFailure", "ToolResult", "tool"],
    "toolrl.core.types": ["ERROR_TYPES", "ParseError", "ParseResult", "ToolCall"],
    "toolrl.core.wrappers": ["MaxTurns", "ObservationBudget", "ToolTimeout", "ToolWrapper"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "ENVS", "ERROR_TYPES", "FORMATS", "BackgroundLoop", "Episode", "MaxTurns", "MessagesSpace",
    "ObservationBudget", "OracleUnavailable", "ParseError", "ParseResult", "Tool", "ToolCall",
    "ToolCallFormat", "ToolEnv", "ToolFailure", "ToolResult", "ToolTimeout", "ToolWrapper", "Turn",
    "env_ids", "get_format", "make_env", "oracle_policy", "register_env", "resolve_astep",
    "run_episode", "tool",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'toolrl.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
