"""What tau2 builds again for every environment, built once a process: its databases and the
agent's tools.

tau2 loads a domain's database from its file every time it builds the domain's environment:
at the start of an episode, and twice in its evaluator (the predicted and the gold
environment). airline's is 7 MB of JSON; loading it (and the garbage collection its objects
cause) is most of an episode's time. Here each domain's databases (the agent's and, telecom,
the user's) are loaded once per process by tau2's own constructor and kept as JSON data
(``model_dump_json``, parsed); every environment gets a fresh copy validated from it
(``model_validate``: what ``DB.load`` does after reading the file, and of the ways to copy
the fastest and the one that allocates the fewest objects for the garbage collector to
walk), passed to tau2's constructor as its ``db`` / ``user_db``. Once per domain a copy is
checked: equal to the loaded database by tau2's own hash (``get_hash``, what the evaluator
compares) and sharing no container with the data; where either failed, copies would be
deep copies of the loaded database.

`evaluation_domain` names the domain in tau2's registry (``register_domain``) with this
constructor, so that tau2's ``evaluate_simulation`` builds its two environments the same way;
tau2's own domain names keep loading from the files.

`agent_tools`: the tools tau2 gives its agent (``get_tools``, plus the user's in solo mode),
built once a domain with their schemas: an episode's agent only shows them; calls run in the
episode's own environment (``Environment.get_response``), as in tau2.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pydantic
from tau2.environment.environment import Environment
from tau2.registry import registry

SUFFIX = "+toolrl-db-copy"  # the registry name of a domain with copied databases
_lock = threading.Lock()


@dataclass(frozen=True)
class _Template:
    type: Any  # the database's pydantic model
    data: Any  # its JSON data, where a copy validated from it is equal and shares nothing
    model: Any  # else the database tau2 loaded (never handed out)

    def copy(self) -> Any:
        if self.data is None:
            return copy.deepcopy(self.model)
        with collector_paused():
            return self.type.model_validate(self.data)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (objects are still freed when
    their last reference goes; cycles wait for the next collection after it). A database
    copy is a tree of ~10^5 fresh objects with no cycles: with the collector on, building one,
    and tau2's evaluator hashing and replaying on two of them, runs collections that walk
    those trees again and again, half of an episode's time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _containers(value: Any, found: set[int]) -> set[int]:
    """The ids of the mutable containers and models inside ``value``."""
    if isinstance(value, pydantic.BaseModel):
        found.add(id(value))
        value = value.__dict__
    if isinstance(value, dict | list | set):
        found.add(id(value))
        for item in value.values() if isinstance(value, dict) else value:
            _containers(item, found)
    return found


def _template(db: Any) -> _Template:
    data = json.loads(db.model_dump_json())
    again = type(db).model_validate(data)
    usable = again.get_hash() == db.get_hash() and not (
        _containers(again, set()) & _containers(data, set()))
    return _Template(type(db), data, None) if usable else _Template(type(db), None, db)


@functools.cache
def templates(domain: str) -> tuple[_Template, _Template | None]:
    """The domain's databases as tau2 loads them (agent's, user's or None), once a process."""
    environment = registry.get_env_constructor(domain)()
    user = environment.user_tools.db if environment.user_tools is not None else None
    out = _template(environment.tools.db), None if user is None else _template(user)
    # The templates live as long as the process: keep the collector from walking their
    # objects in every full collection an episode's copies trigger (a RolloutWorker freezes
    # its startup heap the same way, after vLLM's freeze_gc_heap).
    gc.collect()
    gc.freeze()
    return out


def make_environment(domain: str, solo_mode: bool = False) -> Environment:
    """tau2's environment of ``domain`` on fresh copies of its databases."""
    db, user_db = templates(domain)
    kwargs: dict[str, Any] = {"db": db.copy()}
    if user_db is not None:
        kwargs["user_db"] = user_db.copy()
    return registry.get_env_constructor(domain)(solo_mode=solo_mode, **kwargs)


def evaluation_domain(domain: str) -> str:
    """The name of ``domain`` in tau2's registry whose constructor is `make_environment`."""
    name = domain + SUFFIX
    with _lock:
        if name not in registry.get_domains():
            registry.register_domain(functools.partial(make_environment, domain), name)
    return name


@functools.cache
def agent_tools(domain: str, solo: bool) -> tuple[tuple[Any, dict[str, Any]], ...]:
    """tau2's agent tools of ``domain`` (solo mode: the user's too), as tau2's ``run_task``
    gives them to ``LLMAgent`` / ``LLMSoloAgent``, each with its OpenAI schema (pydantic
    builds ``openai_schema`` on every read); never called (see the module docstring)."""
    environment = make_environment(domain, solo)
    user_tools = environment.get_user_tools() if solo and environment.user_tools is not None \
        else []
    tools = tuple((t, t.openai_schema) for t in environment.get_tools() + user_tools)
    for toolkit in (environment.tools, environment.user_tools):  # (never called: keep no
        if toolkit is not None:                                   # database alive for them)
            toolkit.db = None
    return tools
