"""toolrl: reinforcement learning of tool-calling language models.

The public API, everything an env or reward author needs, is re-exported here; built-in envs,
rewards and the examples import only from ``toolrl`` (as a third-party plugin does)::

    import toolrl
    from toolrl import RewardResult, ToolEnv, Trajectory, Turn, reward, tool

- envs: `ToolEnv` (a Gymnasium env whose action is an assistant message), `Turn`,
  `ChatModel` (the rollout's own engine, as an env may call it: `ToolEnv.rollout_model`),
  `tool` / `Tool`, `ToolFailure`, `SubmitAnswer` / `submit_tool` (episodes that end with a
  ``submit(answer)`` call),
  `register_env`, `make_env`, `env_ids`, the wrappers, `run_episode`, `check_tool_env` and
  `tasks_by_kind` / `make_tasks_by_kind` (a task generator's rows, kind by kind);
- what an episode is: `Trajectory` (the one record of a finished episode, what a reward
  receives) with its `TurnRecord` per assistant turn, `ToolOutput`, `ParseResult`, `ToolCall`;
- rewards: the `reward` decorator, `RewardResult`, `RewardError`, the `RewardFn` protocol;
- helpers for plugins: `bfcl` (BFCL's checker semantics), `bfcl_multi_turn` (BFCL's
  multi-turn backends and checker), `data` (task-row loaders,
  BFCL's files), `get_format` (tool-call formats), `BackgroundLoop`; MCP servers as tools:
  `MCPConnection` (exact timeouts, a stdio server in a process group of its own) and
  `shared_mcp_connection` / `close_mcp_connections` (one server per process, shared by its
  episodes);
- rollouts of your own: `EpisodeRunner` (subclass its hooks to change the episode loop) with
  `EpisodeState`, `EpisodeConfig`, `TurnOutput`, `SamplingConfig`; `RolloutWorker`,
  `RolloutConfig`, `EngineConfig`, `make_rollout_input`.

Names load lazily (``import toolrl`` stays light for Ray and vLLM worker processes).
"""

from __future__ import annotations

import lazy_loader

from toolrl.registry import Registry, RegistryError

__version__ = "0.1.0"

# The public API, each name once, by the module that defines it: `__all__` and `dir(toolrl)`
# are made from this table, and a name is imported on its first use.
__getattr__, _, _lazy = lazy_loader.attach(__name__, submodules=["data"], submod_attrs={
    "core": ["bfcl", "bfcl_multi_turn"],
    "core.background": ["BackgroundLoop"],
    "core.checks": ["check_tool_env"],
    "core.env": ["ChatModel", "OracleUnavailable", "SubmitAnswer", "ToolEnv", "Turn",
                 "make_tasks_by_kind", "oracle_policy", "resolve_astep", "run_episode",
                 "submit_tool", "tasks_by_kind"],
    "core.mcp_client": ["MCPConnection", "close_mcp_connections", "shared_mcp_connection"],
    "core.parse": ["ToolCallFormat", "get_format"],
    "core.registration": ["env_ids", "make_env", "register_env"],
    "core.tools": ["Tool", "ToolFailure", "ToolResult", "tool"],
    "core.trajectory": ["FINISH_REASONS", "TokenStream", "ToolOutput", "Trajectory",
                        "TurnRecord"],
    "core.types": ["ERROR_TYPES", "ParseError", "ParseResult", "ToolCall", "as_tool_call"],
    "core.wrappers": ["MaxTurns", "ObservationBudget", "ToolTimeout", "ToolWrapper"],
    "reward.api": ["BatchedRewardFn", "RewardError", "RewardFn", "RewardResult",
                   "get_reward_spec", "reward"],
    "rollout.engine": ["EngineConfig", "SamplingConfig"],
    "rollout.episode": ["EpisodeConfig", "EpisodeRunner", "EpisodeState", "TurnOutput"],
    "rollout.worker": ["RolloutConfig", "RolloutWorker", "make_rollout_input"],
})
__all__ = ["Registry", "RegistryError", "__version__", *_lazy]


def __dir__() -> list[str]:
    return sorted(__all__)
