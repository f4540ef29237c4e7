"""Env ids: `register_env` over ``gymnasium.register``, `make_env` over ``gymnasium.make``.

Third-party packages (and toolrl's own built-ins) plug in through the ``toolrl.envs``
entry-point group, loaded lazily on the first unknown id. An entry point is either a module
that calls `register_env` when imported (``builtin = "toolrl.envs"``), or an env class whose
entry-point name is the env id (``"acme/Shop-v0" = "acme_envs.shop:ShopEnv"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from toolrl.core.wrappers import ToolWrapper, wrap
from toolrl.registry import Registry, RegistryError

__all__ = ["ENVS", "ensure_registered", "env_class", "env_entry_point", "env_ids", "env_of",
           "make_env", "register_env", "row_env"]

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


def env_entry_point(id: str) -> Any:
    """What ``id`` makes (its env class, or its factory), loaded without making an env; unknown
    ids raise `RegistryError`, an entry point that does not import raises its own error."""
    ensure_registered(id)
    entry_point = gym.spec(id).entry_point
    return load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point


def env_class(id: str) -> Any:
    """The `ToolEnv` class ``id`` makes (for its class data: ``make_tasks``, ``eval_metrics``):
    the entry point when it is a class, else the class of an env its factory makes."""
    entry_point = env_entry_point(id)
    if isinstance(entry_point, type):
        return entry_point
    env = make_env(id)
    try:
        return type(env.unwrapped)
    finally:
        env.close()


def env_of(row: Mapping[str, Any], default_env: str | None) -> str | None:
    """The env a task row runs in: its ``env`` field, else ``default_env`` (the config's
    ``env.id``)."""
    return row.get("env") or default_env


def row_env(row: Mapping[str, Any], env_id: str | None,
            env_kwargs: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(env id, make_env kwargs) of a row: `env_of` with the row's ``env_kwargs``. ``env_kwargs``
    belong to ``env_id``: they apply to rows of that env, under the row's own ``env_kwargs``."""
    if not (row.get("env") or env_id):
        raise ValueError("the row has no 'env' field and no default env is set (the config's "
                         "env.id, RolloutConfig.env_id)")
    own_env = str(env_of(row, env_id))
    own = row.get("env_kwargs") or {}
    if not isinstance(own, Mapping):
        raise ValueError(f"the row's env_kwargs must be an object, got {own!r}")
    base = env_kwargs if own_env == env_id else {}
    return own_env, {**base, **own}


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
