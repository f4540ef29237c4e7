"""Where a model comes from: a local folder or a hub id, decided once, by one rule.

Every place that resolves ``model.path`` (the trainer, the dry run, the memory plan, pre-flight,
``toolrl eval``, the warm start) asks `locate_model`, so a local folder is never mistaken for
a hub id. The rule, first match wins:

1. a path that exists on disk is local;
2. a path the run builds when it is missing (``model.build_tiny_if_missing``; by default
   exactly toolrl's own ``models/tiny``) is local;
3. a path written as one is local: absolute, ``./``, ``../``, ``~``, a backslash, or more
   than one ``/``;
4. ``org/name`` whose ``org`` is a local folder is local (that folder claims the name);
5. anything else that huggingface_hub accepts as a repo id is a hub id.

A local path is never sent to the hub. A hub id is usable when its files are in the local hub
cache or the hub answers within `HUB_TIMEOUT_S`; `require_model` says so at once, in one line,
instead of the minutes of retries transformers spends on an offline machine. A cached hub id
on a machine that cannot reach the hub resolves to its cached snapshot folder, so nothing
downstream asks the hub either.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError
from huggingface_hub.utils import HFValidationError, validate_repo_id

HUB_TIMEOUT_S = 3.0


class ModelNotFoundError(ValueError):
    """A model is neither a local folder nor reachable on the hub; the message is one line."""


@dataclass(frozen=True)
class ModelSource:
    """What ``path`` names: ``local`` (exists), ``build`` (toolrl builds it there) or ``hub``."""

    path: str
    kind: Literal["local", "build", "hub"]

    @property
    def is_local(self) -> bool:
        return self.kind != "hub"


def locate_model(path: str | os.PathLike, build_if_missing: bool = False) -> ModelSource:
    """Apply the module's rule to ``path`` (nothing is fetched, nothing asks the hub)."""
    text = str(path)
    local = Path(text).expanduser()
    if local.exists():
        return ModelSource(text, "local")
    if build_if_missing:
        return ModelSource(text, "build")
    if _written_as_path(text) or not _is_repo_id(text):
        return ModelSource(text, "local")
    return ModelSource(text, "hub")


def require_model(path: str | os.PathLike, build_if_missing: bool = False,
                  key: str = "model.path") -> str:
    """The path to load ``path`` from: itself when local or reachable on the hub, its cached
    snapshot folder when the hub cannot be reached; `ModelNotFoundError` (one line naming
    ``key``) when it is none of these."""
    source = locate_model(path, build_if_missing)
    if source.kind == "build":
        return source.path
    if source.kind == "local":
        if not Path(source.path).expanduser().exists():
            raise ModelNotFoundError(
                f"{key}={source.path!r} does not exist as a local folder; point {key} at a "
                f"checkpoint folder (config.json, weights, tokenizer) or a hub id" +
                ("" if key != "model.path" else
                 ", or set model.build_tiny_if_missing=true to build a tiny model there"))
        return source.path
    cached = cached_snapshot(source.path)
    if hub_reachable():
        return source.path
    if cached is not None:
        return cached
    raise ModelNotFoundError(
        f"{key}={source.path!r} is a hub id that is not in the local hub cache, and the hub "
        f"cannot be reached ({_why_offline()}); set {key} to a local checkpoint folder")


def cached_snapshot(repo_id: str) -> str | None:
    """The local hub cache's snapshot folder of ``repo_id`` (None if it is not cached)."""
    try:
        return snapshot_download(repo_id, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


@functools.cache
def hub_reachable() -> bool:
    """Whether the hub answers an HTTP request within `HUB_TIMEOUT_S` (False when
    ``HF_HUB_OFFLINE`` is set: then nothing is asked)."""
    if _offline_env():
        return False
    try:
        httpx.head(constants.ENDPOINT, timeout=HUB_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    return True


def _offline_env() -> bool:
    return any(os.environ.get(k, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _why_offline() -> str:
    return "HF_HUB_OFFLINE is set" if _offline_env() else \
        f"no answer within {HUB_TIMEOUT_S:g} s"


def _written_as_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~")) or text in (".", "..") or "\\" in text \
        or text.count("/") > 1 or ("/" in text and Path(text.split("/")[0]).is_dir())


def _is_repo_id(text: str) -> bool:
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


__all__ = ["ModelNotFoundError", "ModelSource", "cached_snapshot", "hub_reachable",
           "locate_model", "require_model"]
