"""One generic registry for named plugins (rewards, estimators, losses, formats, trackers).

A `Registry` maps names to objects. Objects arrive two ways: the `register` decorator (used by
built-ins and by third-party code alike), or lazily from an ``importlib.metadata`` entry-point
group the first time a name is missing. Mistakes are loud: a duplicate name, an unknown name
(the error lists the known ones) and a plugin that fails to import. A broken plugin fails
alone: discovery goes on with the others, `failures` names it with its error, asking for its
name raises `PluginImportError`, and an unknown name's error lists it beside the known names.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(LookupError):
    """A name is unknown, registered twice, or its plugin failed to load."""


class PluginImportError(RegistryError, ImportError):
    """An entry-point plugin raised while importing; the message names the plugin. A
    `RegistryError` too: whoever handles an unknown name handles a broken one."""


class Registry(Generic[T]):
    """Name -> object table with decorator registration and lazy entry-point discovery.

    Args:
        kind: what the registry holds, used in error messages ("reward", "advantage estimator").
        group: the ``importlib.metadata`` entry-point group searched on a miss, or None.
    """

    def __init__(self, kind: str, group: str | None = None) -> None:
        self.kind = kind
        self.group = group
        self._items: dict[str, T] = {}
        self._failures: dict[str, str] = {}  # entry-point name -> why it failed to import
        self._discovered = False

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name``; without ``obj``, return a decorator."""
        if obj is not None:
            self._add(name, obj)
            return obj

        def decorator(target: T) -> T:
            self._add(name, target)
            return target

        return decorator

    def _add(self, name: str, obj: T) -> None:
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.kind} names must be non-empty strings, got {name!r}")
        existing = self._items.get(name)
        if existing is not None and existing is not obj:
            raise RegistryError(
                f"{self.kind} {name!r} is already registered (by {_describe(existing)}); "
                f"pick another name or unregister the old one first"
            )
        self._items[name] = obj

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests and interactive sessions)."""
        self._items.pop(name, None)

    def get(self, name: str) -> T:
        """Return the object registered as ``name``, discovering entry points on a miss."""
        if name not in self._items:
            self.discover()
        try:
            return self._items[name]
        except KeyError:
            if name in self._failures:
                raise PluginImportError(self._failures[name]) from None
            known = ", ".join(sorted(self._items)) or "(none)"
            where = f" or entry-point group {self.group!r}" if self.group else ""
            broken = f" Plugins that failed to import: {'; '.join(self._failures.values())}." \
                if self._failures else ""
            raise RegistryError(
                f"unknown {self.kind} {name!r}. Known {self.kind}s: {known}. "
                f"Register it with the decorator{where}.{broken}"
            ) from None

    def discover(self) -> None:
        """Load every entry point of the group once; a plugin that fails to import is kept in
        `failures` (the CLI and unknown-name errors show it) and the others load."""
        if self._discovered or self.group is None:
            return
        self._discovered = True
        for ep in metadata.entry_points(group=self.group):
            if ep.name in self._items:
                continue
            try:
                obj = ep.load()
            except Exception as exc:  # kept with its name, never swallowed
                dist = getattr(ep.dist, "name", "?")
                first = (str(exc).strip().splitlines() or [""])[0]
                self._failures[ep.name] = (
                    f"{self.kind} plugin {ep.name!r} ({ep.value}, from distribution {dist!r}) "
                    f"failed to import: {type(exc).__name__}: {first}")
                continue
            # A module entry point registers its contents by importing; a callable is the item.
            if ep.name not in self._items and not _is_module(obj):
                self._add(ep.name, obj)

    def failures(self) -> dict[str, str]:
        """Entry points of the group that failed to import: name -> one line (which plugin,
        from which distribution, the error)."""
        self.discover()
        return dict(self._failures)

    def names(self) -> list[str]:
        """All known names, entry points included, sorted."""
        self.discover()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        if name not in self._items:
            self.discover()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, group={self.group!r}, items={sorted(self._items)})"


def _is_module(obj: object) -> bool:
    return isinstance(obj, types.ModuleType)


def _describe(obj: object) -> str:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(obj)


def import_object(spec: str, what: str) -> object:
    """The object ``"module:name"`` (or ``"module.name"``) names; a ValueError naming
    ``what`` (the config key it came from) when it cannot be imported."""
    module, _, name = spec.partition(":")
    if not name:
        module, _, name = spec.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"cannot import {what} {spec!r}: {e}") from e
