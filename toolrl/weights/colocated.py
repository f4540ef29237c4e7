"""The colocated route: engines living in this process, which an actor rank of the same
process pushes into directly.

A rollout worker colocated with an actor rank registers its engine's weight routes here
(`register_local_engine`, ``engine.weights``: `toolrl.weights.engine_routes.EngineWeightRoutes`)
and the actor streams into each one's ``load_weights_sync`` (`engine_loader`), which stages the
stream bucket by bucket into its vLLM worker (`toolrl.weights.staging`, `toolrl.weights.ipc`);
`toolrl.workers.weight_push.WeightSync.push_local` is the sending end.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable
from typing import Any

from toolrl.weights.buckets import Named


def engine_loader(engine: Any) -> Callable[[Iterable[Named]], Any]:
    """The blocking ``load_weights`` of an engine (``load_weights_sync`` when it has one, else
    ``load_weights``, awaited if it is a coroutine), or ``engine`` itself if it is callable."""
    fn = getattr(engine, "load_weights_sync", None) or getattr(engine, "load_weights", None)
    if fn is None:
        if callable(engine):
            fn = engine
        else:
            raise TypeError(f"{type(engine).__name__} has no load_weights(_sync) method")

    def load(weights: Iterable[Named]) -> Any:
        result = fn(weights)
        if inspect.isawaitable(result):
            return asyncio.run(result)  # type: ignore[arg-type]
        return result

    return load


_LOCAL_ENGINES: list[Any] = []


def register_local_engine(engine: Any) -> None:
    """Make an engine living in this process a target of a colocated push
    (`toolrl.workers.weight_push.WeightSync.push_local`; a rollout role colocated with an actor
    rank registers its engine here)."""
    if engine not in _LOCAL_ENGINES:
        _LOCAL_ENGINES.append(engine)


def unregister_local_engine(engine: Any) -> None:
    if engine in _LOCAL_ENGINES:
        _LOCAL_ENGINES.remove(engine)


def local_engines() -> list[Any]:
    """Engines registered in this process."""
    return list(_LOCAL_ENGINES)


__all__ = [
    "engine_loader",
    "local_engines",
    "register_local_engine",
    "unregister_local_engine",
]
