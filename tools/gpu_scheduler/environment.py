"""The environment each test file runs in: its devices, a local temp dir, and no stale Ray address.

Two traps this module exists for:

* ``RAY_ADDRESS=""`` does not mean "no cluster": Ray takes the empty string as an address and
  hangs trying to connect. The variable is removed, so ``ray.init()`` starts a local cluster.
* Ray keeps its session files (and the file locks its workers take at startup) under
  ``RAY_TMPDIR``/``TMPDIR``. On a network filesystem those locks go through a lock manager that
  can stall under many workers, so every file gets its own directory on a local filesystem.

The loopback bootstrap guard of `toolrl.controller.network` is applied once for all files.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

# fstype values (from /proc/self/mounts) whose locks or latency are not the local disk's.
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "ceph", "glusterfs", "lustre",
    "gpfs", "beegfs", "panfs", "wekafs", "orangefs", "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse",
    "fuse.glusterfs", "fuse.ceph", "fuse.juicefs", "fuse.rclone",
})
REMOVED_VARIABLES = ("RAY_ADDRESS",)


def _unescape_mount(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem_type(path: str | Path, mounts: str | None = None) -> str | None:
    """The fstype of the mount holding ``path`` (``mounts``: text of /proc/self/mounts)."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    target = os.path.realpath(path)
    best, best_type = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape_mount(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, fields[2]
    return best_type


def is_network_filesystem(path: str | Path, mounts: str | None = None) -> bool:
    fstype = filesystem_type(path, mounts)
    return fstype is not None and (fstype in NETWORK_FILESYSTEMS or fstype.startswith("nfs"))


def local_temp_root(candidates: Sequence[str | Path] | None = None,
                    mounts: str | None = None) -> Path:
    """The first writable temp directory that is not on a network filesystem.

    Tries the usual temp dir (``TMPDIR``), then ``/tmp``, ``/var/tmp``, ``/dev/shm``.

    Raises:
        OSError: every candidate is missing, read-only or remote.
    """
    if candidates is None:
        candidates = [tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"]
    rejected = []
    for candidate in candidates:
        path = Path(candidate)
        if not (path.is_dir() and os.access(path, os.W_OK | os.X_OK)):
            rejected.append(f"{path} (not a writable directory)")
        elif is_network_filesystem(path, mounts):
            rejected.append(f"{path} ({filesystem_type(path, mounts)})")
        else:
            return path
    raise OSError("no local temp directory for test runs; tried " + ", ".join(rejected))


def base_environ(environ: Mapping[str, str] | None = None, *, loopback_guard: bool = True,
                 probe: Callable[[], bool] | None = None) -> tuple[dict[str, str], list[str]]:
    """The environment shared by every test file, and notes on what was changed.

    Removes `REMOVED_VARIABLES` and, with ``loopback_guard``, pins NCCL/Gloo to loopback when
    this host's IP is not self-routable (``probe`` overrides the check, see
    `toolrl.controller.network.apply_loopback_guard`).
    """
    env = dict(os.environ if environ is None else environ)
    notes = []
    for var in REMOVED_VARIABLES:
        if var in env:
            notes.append(f"removed {var}={env.pop(var)!r} (a test starts its own local cluster)")
    if loopback_guard:
        from toolrl.controller.network import apply_loopback_guard

        changed = apply_loopback_guard(env, probe=probe)
        if changed:
            pinned = ", ".join(f"{k}={v}" for k, v in changed.items())
            notes.append(f"host IP is not self-routable: pinned {pinned}")
    return env, notes


REPO_ROOT = Path(__file__).resolve().parents[2]
"""Where ``tools`` lives: on each file's ``PYTHONPATH``, so pytest finds the plugin from any
working directory."""


def job_environ(base: Mapping[str, str], devices: Sequence[str], temp_dir: Path) -> dict[str, str]:
    """One file's environment: its ``CUDA_VISIBLE_DEVICES``, its own local temp dir, and the
    scheduler's plugin importable (`REPO_ROOT` first on ``PYTHONPATH``)."""
    env = dict(base)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    env["TMPDIR"] = env["RAY_TMPDIR"] = str(temp_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
