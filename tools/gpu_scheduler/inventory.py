"""Which devices the scheduler may hand out: given by hand, or found on this machine."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Mapping

NVIDIA_SMI_TIMEOUT_S = 20.0


class InventoryError(ValueError):
    """A ``--devices`` value that is neither a count nor a list of ids."""


def parse_devices(spec: str) -> list[str]:
    """``"4"`` -> ``["0", "1", "2", "3"]``; ``"0,2"`` -> ``["0", "2"]``; ``""``/``"0"`` -> ``[]``.

    A lone integer is a count; write one id as ``"3,"``. Ids are passed through to
    ``CUDA_VISIBLE_DEVICES`` unchanged, so GPU UUIDs work too.
    """
    spec = spec.strip()
    if not spec:
        return []
    if spec.endswith(",") and spec.count(",") == 1 and spec[:-1].strip():
        return [spec[:-1].strip()]
    if "," not in spec:
        try:
            count = int(spec)
        except ValueError:
            return [spec]  # one id such as a UUID
        if count < 0:
            raise InventoryError(f"--devices: a count must be >= 0, got {count}")
        return [str(i) for i in range(count)]
    ids = [part.strip() for part in spec.split(",")]
    if any(not part for part in ids):
        raise InventoryError(f"--devices: empty id in {spec!r}")
    if len(set(ids)) != len(ids):
        raise InventoryError(f"--devices: repeated id in {spec!r}")
    return ids


def _nvidia_smi() -> list[str] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.splitlines() if line.strip()]


def _torch_cuda() -> list[str] | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    try:
        return [str(i) for i in range(torch.cuda.device_count())]
    except RuntimeError:
        return None


def detect_devices(environ: Mapping[str, str] | None = None) -> list[str]:
    """The devices of this machine that this process may use.

    ``CUDA_VISIBLE_DEVICES`` (when set) is the inventory itself: a scheduler started on a slice
    of a node hands out only that slice. Otherwise ``nvidia-smi``, then ``torch.cuda``; no GPU
    gives an empty list.
    """
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    found = _nvidia_smi()
    if found is None:
        found = _torch_cuda()
    return found or []


def resolve_devices(spec: str | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """``--devices`` as given (``None`` or ``"auto"``: `detect_devices`)."""
    if spec is None or spec.strip().lower() == "auto":
        return detect_devices(environ)
    return parse_devices(spec)
