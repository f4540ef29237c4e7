"""FSDP2 training workers: actor, reference, critic, and the actor -> vLLM weight sync.

- `actor`: `ActorConfig`, `FSDPActor` (log-probs, PPO update), `FSDPReference` (frozen),
  and their controller workers `ActorWorker`, `RefWorker`.
- `critic`: `CriticConfig`, `FSDPCritic` (values, clipped value loss), `CriticWorker`.
- `weights`: `WeightSync` (the full weights streamed to engines bucket by bucket, never whole;
  policy version), `WeightSyncGroup` (a dedicated broadcast group for split pools),
  `weights_checksum`.
- `base` / `fsdp` / `micro_batch` / `forward`: the shared FSDP2 model, PPO loop, sharding
  helpers, micro-batch planning and input packing.

Names load lazily, so importing one module does not pull in the others (or Ray).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolrl.workers.actor import (
        ActorConfig,
        ActorWorker,
        FSDPActor,
        FSDPReference,
        RefWorker,
    )
    from toolrl.workers.base import FSDPConfig, FSDPModel
    from toolrl.workers.critic import CriticConfig, CriticWorker, FSDPCritic
    from toolrl.workers.weights import (
        WeightSync,
        WeightSyncGroup,
        register_local_engine,
        weights_checksum,
    )

_LAZY = {
    "ActorConfig": "actor", "ActorWorker": "actor", "FSDPActor": "actor",
    "FSDPReference": "actor", "RefWorker": "actor",
    "FSDPConfig": "base", "FSDPModel": "base",
    "CriticConfig": "critic", "CriticWorker": "critic", "FSDPCritic": "critic",
    "WeightSync": "weights", "WeightSyncGroup": "weights",
    "register_local_engine": "weights", "weights_checksum": "weights",
}

__all__ = [
    "ActorConfig",
    "ActorWorker",
    "CriticConfig",
    "CriticWorker",
    "FSDPActor",
    "FSDPConfig",
    "FSDPCritic",
    "FSDPModel",
    "FSDPReference",
    "RefWorker",
    "WeightSync",
    "WeightSyncGroup",
    "register_local_engine",
    "weights_checksum",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'toolrl.workers' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"toolrl.workers.{module}"), name)
    globals()[name] = value
    return value
