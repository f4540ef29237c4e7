"""The watchdog toolrl puts in front of every server process it starts (Linux).

Run as ``python -I -S watchdog.py PARENT_PID GRACE_S TOKEN -- COMMAND...`` in a new session
(the caller passes ``start_new_session=True``), so the watchdog leads a process group of its
own; it uses the standard library only and starts in ~20 ms. It:

1. asks the kernel for ``SIGUSR1`` when the thread that started it dies
   (``prctl(PR_SET_PDEATHSIG)``), and exits at once if ``PARENT_PID`` is already gone;
2. forks a reaper into its group, which gets the same signal when the watchdog dies (however:
   its parent exited and it followed, or someone SIGKILLed it, as Ray does to the direct
   children of a worker that exits); the reaper then sends ``SIGTERM`` to the group, waits up
   to ``GRACE_S`` for it to go, and SIGKILLs every member left;
3. forks ``COMMAND`` into its group, handing it stdin and stdout (the watchdog keeps no copy,
   so the server's exit closes the pipes as if it ran alone) and keeps stderr;
4. waits. When the server exits, it kills whatever the server left in the group (the reaper
   too) and exits with the server's status (128 + signal when killed). A ``SIGTERM`` sent to
   the group (the MCP SDK's shutdown) reaches the server directly; the watchdog waits for the
   server's exit and then cleans up as above.

``TOKEN`` only labels the process (``/proc/PID/cmdline``) so its owner can find it again.
"""

import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PARENT_GONE = signal.SIGUSR1


def group_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` (from ``/proc``), this process excluded."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "(comm)": state ppid pgrp ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            found.append(int(name))
    return found


def kill_others(pgid: int) -> None:
    """SIGKILL every other live member of the group (repeat: members may still fork)."""
    for _ in range(50):
        members = group_members(pgid)
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def end_group(pgid: int, grace: float) -> None:
    """SIGTERM the group, wait up to ``grace`` s for it to go, then SIGKILL what is left
    (this process excepted: it has SIGTERM blocked and exits after)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    kill_others(pgid)


def reaper(watchdog: int, pgid: int, grace: float, libc) -> None:
    """The reaper's life: wait for the watchdog's death (its parent-death signal), then end
    the group. It covers a watchdog killed outright (e.g. Ray SIGKILLs the direct children of a
    worker that exits), which could not clean up itself."""
    libc.prctl(PR_SET_PDEATHSIG, int(PARENT_GONE), 0, 0, 0)
    if os.getppid() == watchdog:
        while signal.sigwaitinfo({PARENT_GONE}).si_signo != PARENT_GONE:
            pass
    end_group(pgid, grace)


def main() -> int:
    args = sys.argv[1:]
    if len(args) < 5 or args[3] != "--":
        sys.stderr.write("usage: watchdog.py PARENT_PID GRACE_S TOKEN -- COMMAND...\n")
        return 2
    parent, grace, command = int(args[0]), float(args[1]), args[4:]
    with contextlib.suppress(OSError):  # a session leader already (start_new_session)
        os.setsid()
    pgid = os.getpgrp()
    # No handlers: signals are taken one at a time with sigwaitinfo.
    watched = {signal.SIGCHLD, PARENT_GONE, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(PARENT_GONE), 0, 0, 0) != 0:
        sys.stderr.write("toolrl watchdog: prctl(PR_SET_PDEATHSIG) failed\n")
    if os.getppid() != parent:  # the parent died before the prctl
        return 1
    me = os.getpid()
    if os.fork() == 0:
        try:
            reaper(me, pgid, grace, libc)
        finally:
            os._exit(0)
    pid = os.fork()
    if pid == 0:  # the server: nothing blocked, default handlers
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"toolrl watchdog: cannot run {command[0]!r}: {exc}\n".encode())
        os._exit(127)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    while True:
        info = signal.sigwaitinfo(watched)
        if info.si_signo == PARENT_GONE:
            return 1  # the reaper sees this exit and ends the group
        if info.si_signo == signal.SIGCHLD:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                break
        # SIGTERM sent to the group reached the server too: wait for its exit
    kill_others(pgid)  # what the server left, and the reaper
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


if __name__ == "__main__":
    sys.exit(main())
