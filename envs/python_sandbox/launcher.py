"""Sandbox launcher: isolate with kernel namespaces, limit, then exec Python on the user's code.

Run by `toolrl.envs.python_sandbox.sandbox` as ``python -I -S launcher.py CONFIG_JSON`` with the
work directory as cwd; it uses the standard library only. Steps, failing closed (exit code 97,
``SANDBOX_ERROR: ...`` on stderr, the user's code never runs) when any isolation step fails:

1. ``unshare`` new mount, network, PID, IPC and UTS namespaces (plus a user namespace when not
   root). The new network namespace has only a down loopback: no network at all.
2. Make every mount read-only except the work directory (a bind mount of itself). When root,
   expose the interpreter's install directory if it sits under a directory other users cannot
   enter (e.g. ``/root``), by covering that directory with an empty tmpfs and bind-mounting the
   install back, so the code can run as an unprivileged uid.
3. Fork: the child is PID 1 of the new PID namespace (when it dies, the kernel kills every
   process the code started, even ones that called setsid). It mounts a fresh ``/proc``, sets
   the rlimits (CPU, address space, file size, open files, processes, no core), drops to the
   run's own unprivileged uid (``config["uid"]``) when root, sets no_new_privs and a
   parent-death SIGKILL, and execs ``python -I main.py``. The launcher waits and exits with the
   child's status (128+signal when killed).
"""

import ctypes
import json
import os
import resource
import signal
import stat
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
          "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_void_p]
libc.unshare.argtypes = [ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                       ctypes.c_ulong]


class SandboxError(Exception):
    pass


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(errno)} (errno {errno})")


def _mount(source, target, fstype, flags, what):
    _check(libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                      flags, None), what)


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _mountpoints():
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = parts[4].encode().decode("unicode_escape")
            flags = 0
            for option in parts[5].split(","):
                flags |= _FLAGS.get(option, 0)
            out.append((point, flags))
    return out


def _closed_ancestor(path):
    """The highest ancestor of ``path`` that other users cannot traverse, or None."""
    current = "/"
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return current
    return None


def _expose(paths, staging):
    """Cover closed directories with a tmpfs and bind the interpreter installs back."""
    for i, path in enumerate(paths):
        closed = _closed_ancestor(path)
        if closed is None:
            continue
        stage = os.path.join(staging, f"install{i}")
        os.makedirs(stage)
        _mount(path, stage, None, MS_BIND | MS_REC, f"stage {path}")
        _mount("tmpfs", closed, "tmpfs", MS_NOSUID | MS_NODEV, f"cover {closed}")
        os.chmod(closed, 0o755)
        os.makedirs(path, mode=0o755, exist_ok=True)
        _mount(stage, path, None, MS_BIND | MS_REC, f"expose {path}")


def isolate(config):
    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    _check(libc.unshare(flags | (0 if root else CLONE_NEWUSER)), "unshare namespaces")
    if not root:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount("none", "/", None, MS_REC | MS_PRIVATE, "make mounts private")
    work = os.path.realpath(config["workdir"])
    _mount(work, work, None, MS_BIND, "bind the work directory")
    if root:
        staging = os.path.join(work, ".sandbox")
        os.makedirs(staging)
        _expose(sorted({os.path.realpath(p) for p in config["expose"]}), staging)
    for point, mount_flags in _mountpoints():
        if point == work:
            continue
        result = libc.mount(None, point.encode(), None,
                            MS_REMOUNT | MS_BIND | MS_RDONLY | mount_flags, None)
        if result != 0 and point == "/":
            _check(result, "remount / read-only")


def child(config):
    """PID 1 of the new namespace: limits, privileges, exec."""
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mount /proc")
    except SandboxError:
        if os.geteuid() == 0:
            raise
    os.chdir(os.path.realpath(config["workdir"]))  # onto the writable bind mount
    limits = config["limits"]
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.geteuid() == 0:  # a uid of its own: RLIMIT_NPROC counts this run's processes only
        uid = int(config["uid"])
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    else:  # RLIMIT_NPROC counts all of this user's processes: allow the existing ones too
        mine = sum(1 for p in os.listdir("/proc") if p.isdigit())
        resource.setrlimit(resource.RLIMIT_NPROC, (mine + limits["processes"],) * 2)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
    os.execve(config["python"], [config["python"], "-I", config["script"]], config["env"])


def main():
    config = json.loads(sys.argv[1])
    try:
        isolate(config)
    except (SandboxError, OSError) as exc:
        sys.stderr.write(f"SANDBOX_ERROR: {exc}\n")
        return 97
    if config.get("probe"):
        return 0
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            child(config)
        except BaseException as exc:  # never run the code half-isolated
            os.write(2, f"SANDBOX_ERROR: {type(exc).__name__}: {exc}\n".encode())
        os._exit(97)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
