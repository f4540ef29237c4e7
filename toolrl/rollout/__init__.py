"""Multi-turn rollouts on vLLM: engine, chat-template deltas, episodes, rollout workers.

- `engine`: `VLLMEngine` (token ids in; ids, log-probs, finish reason out; in-place
  `load_weights`, bucket by bucket), `EngineConfig`, `SamplingConfig`.
- `weight_transfer`: how a bucket of weights reaches vLLM's worker (shared-memory staging and
  the worker extension on CPU, vLLM's IPC / NCCL weight transfer on GPU).
- `chat`: `ChatRenderer` (first prompt, per-turn deltas, prefix-preserving check).
- `episode`: `EpisodeRunner` (one episode; subclass its hooks to change the loop).
- `worker`: `RolloutWorker` (a controller Worker running episodes concurrently).

Names load lazily: vLLM imports ``toolrl.rollout.weight_transfer`` inside its own worker
processes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolrl.rollout.chat import ChatRenderer, ConformanceReport, TemplateError
    from toolrl.rollout.engine import (
        Completion,
        ContextLengthError,
        EngineConfig,
        EngineError,
        SamplingConfig,
        VLLMEngine,
    )
    from toolrl.rollout.episode import (
        EpisodeConfig,
        EpisodeResult,
        EpisodeRunner,
        EpisodeState,
        TurnOutput,
    )
    from toolrl.rollout.worker import (
        RolloutConfig,
        RolloutWorker,
        make_rollout_input,
        rollout_metrics,
    )

_LAZY = {
    "ChatRenderer": "chat", "ConformanceReport": "chat", "TemplateError": "chat",
    "Completion": "engine", "ContextLengthError": "engine", "EngineConfig": "engine",
    "EngineError": "engine", "SamplingConfig": "engine", "VLLMEngine": "engine",
    "EpisodeConfig": "episode", "EpisodeResult": "episode", "EpisodeRunner": "episode",
    "EpisodeState": "episode", "TurnOutput": "episode",
    "RolloutConfig": "worker", "RolloutWorker": "worker", "make_rollout_input": "worker",
    "rollout_metrics": "worker",
}

__all__ = [
    "ChatRenderer",
    "Completion",
    "ConformanceReport",
    "ContextLengthError",
    "EngineConfig",
    "EngineError",
    "EpisodeConfig",
    "EpisodeResult",
    "EpisodeRunner",
    "EpisodeState",
    "RolloutConfig",
    "RolloutWorker",
    "SamplingConfig",
    "TemplateError",
    "TurnOutput",
    "VLLMEngine",
    "make_rollout_input",
    "rollout_metrics",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'toolrl.rollout' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"toolrl.rollout.{module}"), name)
    globals()[name] = value
    return value
