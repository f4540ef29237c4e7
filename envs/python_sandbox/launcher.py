"""Sandbox launcher: isolate with kernel namespaces, limit, then exec Python on the user's code.

Run by `toolrl.envs.python_sandbox.sandbox` as ``python -I -S launcher.py CONFIG_JSON`` with the
work directory as cwd; it uses the standard library only. Steps, failing closed (exit code 97,
``SANDBOX_ERROR: ...`` on stderr, the user's code never runs) when any isolation step fails:

1. ``unshare`` new mount, network, PID, IPC and UTS namespaces (plus a user namespace when not
   root). The new network namespace has only a down loopback: no network at all.
2. Make every mount read-only except the work directory (a bind mount of itself).
3. Switch to a fresh root (a tmpfs moved onto ``/``, then ``chroot``) that holds only the system
   directories (``SYSTEM_DIRS``), the Python install (the interpreter's directory and
   ``config["expose"]``), a minimal ``/dev`` (``DEVICES``), an empty ``/proc`` mount point and
   the work directory (the only writable place). Home and data directories, ``/tmp``, the
   project and other runs' files do not exist in that view. The directories leading to the
   Python install are fresh ones (mode 755), so the run's uid reaches an install under a
   directory it could not enter on the host (e.g. ``/root``).
4. Fork: the child is PID 1 of the new PID namespace (when it dies, the kernel kills every
   process the code started, even ones that called setsid). It mounts a fresh ``/proc``, sets
   the rlimits (CPU, address space, file size, open files, processes, no core), drops to the
   run's own unprivileged uid (``config["uid"]``) when root, sets no_new_privs and a
   parent-death SIGKILL, and execs ``python -I main.py``. The launcher waits and exits with the
   child's status (128+signal when killed). The launcher itself gets a parent-death SIGKILL
   too, so a killed toolrl process takes the whole sandbox with it.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_MOVE = 32, 1024, 2048, 4096, 8192
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# What the code sees of the host, read-only: programs, libraries and /etc (plus the Python
# install and its work directory). Symlinked entries (merged /usr) are recreated as symlinks.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
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


def _mount(source, target, fstype, flags, what, data=None):
    _check(libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                      flags, data and data.encode()), what)


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


def _bind(source, target, what, flags=MS_BIND | MS_REC):
    if os.path.isdir(source):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        with open(target, "a"):
            pass
    _mount(source, target, None, flags, what)


def _enter_new_root(work, config):
    """Chroot into a tmpfs holding only what the code may see (every bind stays read-only:
    the mounts it copies were remounted read-only before, except the work directory)."""
    new = os.path.join(work, ".root")
    os.mkdir(new, 0o755)
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mount the new root", "mode=0755")
    shown = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            os.symlink(os.readlink(path), new + path)
        elif os.path.isdir(path):
            shown.append(path)
    python_dir = os.path.dirname(os.path.realpath(config["python"]))
    for path in sorted({os.path.realpath(p) for p in [*config["expose"], python_dir]}):
        if not any(path == d or path.startswith(d.rstrip("/") + "/") for d in shown):
            shown.append(path)
    for path in shown:
        _bind(path, new + path, f"expose {path}")
    dev = new + "/dev"
    os.mkdir(dev, 0o755)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mount /dev", "mode=0755")
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            _bind("/dev/" + name, f"{dev}/{name}", f"expose /dev/{name}")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{dev}/{name}")
    os.symlink("/proc/self/fd", dev + "/fd")
    _mount(None, dev, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID, "remount /dev read-only")
    os.mkdir(new + "/proc", 0o555)
    _bind(work, new + work, "bind the work directory into the new root", MS_BIND)
    _mount(None, new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
           "remount the new root read-only")
    os.chdir(new)
    _mount(new, "/", None, MS_MOVE, "move the new root onto /")
    os.chroot(".")
    os.chdir(work)
    os.rmdir(".root")  # the (now empty) mount point, seen through the work directory


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
    for point, mount_flags in _mountpoints():
        if point == work:
            continue
        result = libc.mount(None, point.encode(), None,
                            MS_REMOUNT | MS_BIND | MS_RDONLY | mount_flags, None)
        if result != 0 and point == "/":
            _check(result, "remount / read-only")
    _enter_new_root(work, config)


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
    # Die with the toolrl process that started us (even a SIGKILLed one): the child below
    # dies with us, and with it every process of its PID namespace. Set after `isolate`, as
    # credential changes clear it.
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or \
            os.getppid() != config.get("parent", os.getppid()):
        sys.stderr.write("SANDBOX_ERROR: the parent is gone (or prctl failed)\n")
        return 97
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
