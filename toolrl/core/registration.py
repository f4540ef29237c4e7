"""Env ids: `register_env` over ``gymnasium.register``, `make_env` over ``gymnasium.make``.

Third-party packages (and toolrl's own built-ins) plug in through the ``toolrl.envs``
entry-point group, loaded lazily on the first unknown id. An entry point is either a module
that calls `register_env` when imported (``builtin = "toolrl.envs"``), or an env class whose
entry-point name is the env id (``"acme/Shop-v0" = "acme_envs.shop:ShopEnv"``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from toolrl.core.wrappers import ToolWrapper, wrap
from toolrl.registry import Registry, RegistryError

__all__ = ["ENVS", "ensure_registered", "env_class", "env_ids", "make_env", "register_env"]

# env id -> entry point ("module:Class" or the class itself)
ENVS: Registry[Any] = Registry("environment", group="toolrl.envs")


def _same_entry_point(a: Any, b: Any) -> bool:
    def key(x: Any) -> str:
        return x if isinstance(x, str) else f"{x.__module__}:{x.__qualname__}"

    return key(a) == key(b)


def register_env(id: str, entry_point: Any, *, kwargs: dict[str, Any] | None = None,
                 nondeterministic: bool = False, **spec: Any) -> None:
    """Register a tool env id (``"namespace/Name-v0"``) with gymnasium and toolrl.

    Registering the same id with the same entry point again is a no-op (importing a plugin twice
    is harmless); a different entry point under a known id is an error.
    """
    existing = gym.registry.get(id)
    if existing is not None:
        if not _same_entry_point(existing.entry_point, entry_point) or \
                (kwargs or {}) != (existing.kwargs or {}):
            raise RegistryError(
                f"environment {id!r} is already registered with entry point "
                f"{existing.entry_point!r}; pick another id or bump the version")
    else:
        gym.register(id=id, entry_point=entry_point, kwargs=kwargs or {},
                     nondeterministic=nondeterministic, **spec)
    try:
        ENVS.register(id, entry_point)
    except RegistryError:  # known already: fine when it is the same entry point
        if not _same_entry_point(ENVS.get(id), entry_point):
            raise


def env_ids() -> list[str]:
    """Every known toolrl env id (entry-point plugins included)."""
    return ENVS.names()


def ensure_registered(id: str) -> None:
    """Make ``id`` known to gymnasium, loading plugins if needed; unknown ids raise
    `RegistryError` listing the known ones."""
    if id in gym.registry:
        return
    entry_point = ENVS.get(id)  # discovers the plugins; an unknown id raises, listing known ids
    if id not in gym.registry:  # a class-valued entry point: its name is the id
        gym.register(id=id, entry_point=entry_point)


def env_class(id: str) -> Any:
    """What ``id`` makes (its env class, or its creator), without making one; unknown ids raise
    `RegistryError`."""
    ensure_registered(id)
    entry_point = gym.spec(id).entry_point
    if isinstance(entry_point, str):
        from gymnasium.envs.registration import load_env_creator

        return load_env_creator(entry_point)
    return entry_point


def make_env(id: str, *, observation_budget: int | None = None, tokenizer: Any = None,
             **kwargs: Any) -> ToolWrapper:
    """Make a tool env by id: ``gymnasium.make(id, **kwargs)`` inside a `ToolWrapper`.

    ``kwargs`` go to the env (``max_turns``, ``tool_timeout``, ``max_output_chars``,
    ``tool_format`` and env-specific ones); ``observation_budget`` (chars, or tokens with
    ``tokenizer``) adds the `ObservationBudget` wrapper. The result is always a `ToolWrapper`,
    so ``await env.astep(text)`` works through gymnasium's own wrappers; ``env.unwrapped`` is
    the `ToolEnv`.
    """
    ensure_registered(id)
    env = gym.make(id, **kwargs)
    return wrap(env, observation_budget=observation_budget, tokenizer=tokenizer)
