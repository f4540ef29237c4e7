"""The watchdog toolrl puts in front of every server process it starts (Linux).

Run as ``python -I -S watchdog.py PARENT_PID GRACE_S TOKEN -- COMMAND...`` in a new session
(the caller passes ``start_new_session=True``), so the watchdog leads a process group of its
own; it uses the standard library only and starts in ~20 ms. It:

1. asks the kernel for ``SIGUSR1`` when the thread that started it dies
   (``prctl(PR_SET_PDEATHSIG)``), and exits at once if ``PARENT_PID`` is already gone;
2. forks ``COMMAND`` into its group, handing it stdin and stdout (the watchdog keeps no copy,
   so the server's exit closes the pipes as if it ran alone) and keeps stderr;
3. waits. When the server exits, it kills whatever the server left in the group and exits
   with the server's status (128 + signal when killed). On ``SIGUSR1`` (the parent died, even
   by SIGKILL) it sends ``SIGTERM`` to the group, waits up to ``GRACE_S`` for the server,
   then kills every other member (SIGKILL) and exits. A ``SIGTERM`` sent to the group (the
   MCP SDK's shutdown) reaches the server directly; the watchdog waits for the server's exit
   and then cleans up as above.

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


def main() -> int:
    args = sys.argv[1:]
    if len(args) < 5 or args[3] != "--":
        sys.stderr.write("usage: watchdog.py PARENT_PID GRACE_S TOKEN -- COMMAND...\n")
        return 2
    parent, grace, command = int(args[0]), float(args[1]), args[4:]
    with contextlib.suppress(OSError):  # a session leader already (start_new_session)
        os.setsid()
    pgid = os.getpgrp()
    # No handlers: the watchdog takes its signals one at a time with sigwaitinfo.
    watched = {signal.SIGCHLD, PARENT_GONE, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(PARENT_GONE), 0, 0, 0) != 0:
        sys.stderr.write("toolrl watchdog: prctl(PR_SET_PDEATHSIG) failed\n")
    if os.getppid() != parent:  # the parent died before the prctl
        return 1
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
    status = None
    while status is None:
        info = signal.sigwaitinfo(watched)
        if info.si_signo == PARENT_GONE:
            status = stop(pid, pgid, grace)
        elif info.si_signo == signal.SIGCHLD:
            done, wstatus = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                status = wstatus
        # SIGTERM sent to the group reached the server too: wait for its exit
    kill_others(pgid)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def stop(pid: int, pgid: int, grace: float) -> int:
    """The parent is gone: SIGTERM the group, wait up to ``grace`` s for the server, then its
    wait status (a SIGKILL status when it had to be killed)."""
    with contextlib.suppress(ProcessLookupError):  # blocked here, delivered to the rest
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while True:
        done, wstatus = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return wstatus
        left = deadline - time.monotonic()
        if left <= 0:
            break
        signal.sigtimedwait({signal.SIGCHLD}, min(left, 0.05))
    try:
        os.kill(pid, signal.SIGKILL)
        return os.waitpid(pid, 0)[1]
    except (ProcessLookupError, ChildProcessError):
        return signal.SIGKILL


if __name__ == "__main__":
    sys.exit(main())
