"""Pack test files onto free devices: each file is one pytest process on the devices it declares.

    python -m tools.gpu_scheduler tests/ --devices 4 --timeout 600 --heartbeat 60 -- -x

The schedule is greedy: whenever devices are free, the largest pending file that fits is
started on the lowest free ids (``CUDA_VISIBLE_DEVICES``), so a gap left by a finished file
is refilled at once. Every file runs in its own session; when it ends (passed, failed, timed
out or interrupted) its whole process group and every process carrying its tag are killed
before its devices are handed out again, so Ray workers and distributed ranks cannot hold a
"free" card. Ctrl+C (or SIGTERM) kills every group and still prints a summary of every file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tools.gpu_scheduler.collect import CollectError, TestFile, collect
from tools.gpu_scheduler.environment import base_environ, job_environ, local_temp_root
from tools.gpu_scheduler.inventory import InventoryError, resolve_devices
from tools.gpu_scheduler.processes import add_tag, job_processes, signal_job, snapshot

PLUGIN = "tools.gpu_scheduler.plugin"
PYTEST_NO_TESTS = 5  # pytest's exit code when nothing was collected
EXIT_INTERRUPTED = 130
LOG_TAIL_LINES = 30
_POLL_S = 0.05


class FileStatus(enum.StrEnum):
    PASSED = "passed"
    NO_TESTS = "no tests"
    FAILED = "failed"
    TIMED_OUT = "timed out"
    INTERRUPTED = "interrupted"
    NOT_STARTED = "not started"
    UNSCHEDULABLE = "unschedulable"

    @property
    def ok(self) -> bool:
        return self in (FileStatus.PASSED, FileStatus.NO_TESTS)


_STYLES = {FileStatus.PASSED: "green", FileStatus.NO_TESTS: "yellow", FileStatus.FAILED: "red",
           FileStatus.TIMED_OUT: "red", FileStatus.INTERRUPTED: "magenta",
           FileStatus.NOT_STARTED: "dim", FileStatus.UNSCHEDULABLE: "red"}


@dataclass
class FileResult:
    """What happened to one test file. Times are ``time.time()`` seconds."""

    path: Path
    devices_needed: int
    status: FileStatus = FileStatus.NOT_STARTED
    devices: tuple[str, ...] = ()
    returncode: int | None = None
    start: float | None = None
    end: float | None = None
    log: Path | None = None
    detail: str = ""

    @property
    def duration_s(self) -> float | None:
        return None if self.start is None or self.end is None else self.end - self.start


@dataclass(frozen=True)
class SchedulerOptions:
    """How files are run. ``heartbeat_s=0`` turns the heartbeat off."""

    devices: tuple[str, ...]
    timeout_s: float = 900.0
    heartbeat_s: float = 60.0
    pytest_args: tuple[str, ...] = ()
    jobs: int | None = None  # most files at once; default: one per device (at least 1)
    kill_grace_s: float = 5.0  # SIGTERM -> SIGKILL
    log_dir: Path | None = None  # keep each file's output here (default: a temp dir)
    loopback_guard: bool = True
    python: str = sys.executable
    cwd: Path | None = None

    @property
    def max_jobs(self) -> int:
        return self.jobs if self.jobs is not None else max(1, len(self.devices))


@dataclass
class _Job:
    file: TestFile
    result: FileResult
    index: int
    tag: str
    temp_dir: Path | None = None
    proc: asyncio.subprocess.Process | None = None
    monotonic_start: float = 0.0
    settled: bool = False
    reaped: bool = False
    quarantined: bool = False

    def settle(self, status: FileStatus, detail: str = "") -> None:
        """Record the first final status only (a late exit code cannot overwrite a timeout)."""
        if not self.settled:
            self.settled = True
            self.result.status = status
            self.result.detail = detail


class Scheduler:
    """Runs test files as pytest subprocesses on a fixed inventory of devices."""

    def __init__(self, files: Sequence[TestFile], options: SchedulerOptions,
                 console: Console | None = None) -> None:
        if len(set(options.devices)) != len(options.devices):
            raise InventoryError(f"repeated device id in {list(options.devices)}")
        self.options = options
        self.console = console or Console(highlight=False)
        self.interrupted = False
        self._run_id = uuid.uuid4().hex[:12]
        self._jobs = [_Job(f, FileResult(f.path, f.devices), i, f"{self._run_id}-{i}")
                      for i, f in enumerate(files)]
        # Largest need first; ties in path order, so a run is reproducible.
        self._pending = sorted((j for j in self._jobs if j.file.devices <= len(options.devices)),
                               key=lambda j: (-j.file.devices, str(j.file.path)))
        for job in self._jobs:
            if job.file.devices > len(options.devices):
                job.result.status = FileStatus.UNSCHEDULABLE
                job.result.detail = (f"needs {job.file.devices} devices, the inventory has "
                                     f"{len(options.devices)}")
        self._free = list(options.devices)
        self._quarantined: list[str] = []
        self._running: dict[asyncio.Task[None], _Job] = {}
        self._launched: list[_Job] = []
        self._base_env: dict[str, str] = {}
        self._scratch: Path | None = None
        self._tick = 0
        self.wall_s = 0.0

    # ---------------------------------------------------------------- output

    def _say(self, text: str, style: str = "") -> None:
        self.console.print(Text(text, style=style), soft_wrap=True)

    def _name(self, path: Path) -> str:
        cwd = self.options.cwd or Path.cwd()
        try:
            return str(path.resolve().relative_to(cwd.resolve()))
        except ValueError:
            return str(path)

    def _print_log_tail(self, job: _Job) -> None:
        log = job.result.log
        if log is None or not log.exists():
            return
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        self._say(f"----- last {len(lines)} lines of {self._name(job.file.path)} -----", "dim")
        for line in lines:
            self._say(line)

    # -------------------------------------------------------------- schedule

    async def run(self, scratch: Path) -> None:
        """Run every schedulable file; returns when all ended or the run was interrupted.

        ``scratch`` (a local directory) holds per-file temp dirs and, without ``log_dir``, the
        logs; the caller removes it. Interruption (task cancelled, KeyboardInterrupt, SIGTERM)
        kills every running file and returns normally with ``self.interrupted`` set.
        """
        self._scratch = scratch
        self._base_env, notes = base_environ(loopback_guard=self.options.loopback_guard)
        for note in notes:
            self._say(f"environment: {note}", "dim")
        for job in self._jobs:
            if job.result.status is FileStatus.UNSCHEDULABLE:
                self._say(f"UNSCHEDULABLE {self._name(job.file.path)}: {job.result.detail}", "red")
        loop = asyncio.get_running_loop()
        main = asyncio.current_task()
        sigterm = False
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            if main is not None:
                loop.add_signal_handler(signal.SIGTERM, main.cancel)
                sigterm = True
        start = time.monotonic()
        try:
            await self._schedule(start)
        except (asyncio.CancelledError, KeyboardInterrupt):
            self.interrupted = True
            self._say(f"interrupted: stopping {len(self._running)} running file(s)", "magenta")
            await self._stop_running()
        finally:
            if sigterm:
                loop.remove_signal_handler(signal.SIGTERM)
            self.wall_s = time.monotonic() - start

    async def _schedule(self, start: float) -> None:
        beat = self.options.heartbeat_s
        next_beat = start + beat
        while self._pending or self._running:
            self._launch_fitting()
            if not self._running:  # what is left cannot fit: devices were quarantined
                self._say(f"{len(self._pending)} file(s) not started: devices "
                          f"[{','.join(self._quarantined)}] are held by processes that "
                          f"survived SIGKILL", "red")
                break
            wait_s = max(0.0, next_beat - time.monotonic()) if beat > 0 else None
            done, _ = await asyncio.wait(self._running, timeout=wait_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                self._finish(task)
            now = time.monotonic()
            if beat > 0 and now >= next_beat:
                self._tick += 1
                for job in self._running.values():
                    if now - job.monotonic_start < beat:
                        continue  # started since the last beat: not a long file (yet)
                    self._say(f"heartbeat {self._tick}: {self._name(job.file.path)} running "
                              f"{now - job.monotonic_start:.0f}s on devices "
                              f"[{','.join(job.result.devices)}]", "cyan")
                while next_beat <= now:
                    next_beat += beat

    def _launch_fitting(self) -> None:
        for job in list(self._pending):
            if len(self._running) >= self.options.max_jobs:
                return
            if job.file.devices <= len(self._free):
                self._pending.remove(job)
                order = {d: i for i, d in enumerate(self.options.devices)}
                self._free.sort(key=order.__getitem__)
                job.result.devices = tuple(self._free[:job.file.devices])
                del self._free[:job.file.devices]
                self._running[asyncio.create_task(self._run_job(job))] = job
                self._launched.append(job)

    def _finish(self, task: asyncio.Task[None]) -> None:
        job = self._running.pop(task)
        if not task.cancelled() and task.exception() is not None:
            job.settle(FileStatus.FAILED, f"scheduler error: {task.exception()!r}")
        self._complete(job)

    def _complete(self, job: _Job) -> None:
        job.settle(FileStatus.INTERRUPTED)
        status = job.result.status
        if job.quarantined:
            self._quarantined.extend(job.result.devices)
        else:
            self._free.extend(job.result.devices)
        duration = job.result.duration_s or 0.0
        rc = "" if job.result.returncode is None else f" (exit {job.result.returncode})"
        self._say(f"{status.value.upper():12s} {self._name(job.file.path)} "
                  f"{duration:.1f}s{rc} {job.result.detail}".rstrip(), _STYLES[status])
        if not status.ok and status is not FileStatus.INTERRUPTED:
            self._print_log_tail(job)

    async def _stop_running(self) -> None:
        tasks = list(self._running)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=self.options.kill_grace_s + 15.0)
        for task in tasks:
            if task in self._running:
                self._complete(self._running.pop(task))

    # --------------------------------------------------------------- one file

    async def _run_job(self, job: _Job) -> None:
        assert self._scratch is not None
        opts = self.options
        job.temp_dir = self._scratch / f"j{job.index}"
        job.temp_dir.mkdir()
        log_dir = opts.log_dir or self._scratch / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        job.result.log = log_dir / (self._name(job.file.path).replace("/", "__") + ".log")
        env = job_environ(self._base_env, job.result.devices, job.temp_dir)
        add_tag(env, job.tag)
        plugin = [] if PLUGIN in opts.pytest_args else ["-p", PLUGIN]
        cmd = [opts.python, "-m", "pytest", str(job.file.path), *plugin, *opts.pytest_args]
        self._say(f"START        {self._name(job.file.path)} on devices "
                  f"[{','.join(job.result.devices)}]", "blue")
        job.monotonic_start = time.monotonic()
        job.result.start = time.time()
        try:
            with open(job.result.log, "wb") as log:
                job.proc = await asyncio.create_subprocess_exec(
                    *cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=env, cwd=opts.cwd, start_new_session=True)
            rc = await asyncio.wait_for(job.proc.wait(), opts.timeout_s)
            job.result.returncode = rc
            job.settle(FileStatus.PASSED if rc == 0 else
                       FileStatus.NO_TESTS if rc == PYTEST_NO_TESTS else FileStatus.FAILED)
        except TimeoutError:
            job.settle(FileStatus.TIMED_OUT, f"after {opts.timeout_s:g}s")
        except asyncio.CancelledError:
            job.settle(FileStatus.INTERRUPTED)
        except OSError as exc:
            job.settle(FileStatus.FAILED, f"could not start pytest: {exc}")
        finally:
            await self._reap(job)
            job.result.end = time.time()
            shutil.rmtree(job.temp_dir, ignore_errors=True)

    async def _reap(self, job: _Job) -> None:
        """Kill whatever is left of the file (TERM, then KILL) and wait until it is gone."""
        pgid = job.proc.pid if job.proc is not None else None
        for sig, wait_s in ((signal.SIGTERM, self.options.kill_grace_s), (signal.SIGKILL, 10.0)):
            if not signal_job(pgid, job.tag, sig):
                break
            deadline = time.monotonic() + wait_s
            while job_processes(pgid, job.tag) and time.monotonic() < deadline:
                await asyncio.sleep(_POLL_S)
        if job.proc is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(job.proc.wait(), 10.0)
            if job.result.status is not FileStatus.TIMED_OUT:
                job.result.returncode = job.proc.returncode
        survivors = job_processes(pgid, job.tag)
        if survivors:
            job.quarantined = True
            job.result.detail += f" devices quarantined: {sorted(survivors)} survived SIGKILL"
        job.reaped = True

    def kill_everything(self) -> None:
        """Synchronous last resort: SIGKILL every file not yet reaped, and wait for the kill."""
        alive = [j for j in self._launched if not j.reaped]
        deadline = time.monotonic() + 10.0
        while alive and time.monotonic() < deadline:
            procs = snapshot()
            alive = [j for j in alive if signal_job(j.proc.pid if j.proc else None, j.tag,
                                                    signal.SIGKILL, procs)]
            time.sleep(_POLL_S)

    def results(self) -> list[FileResult]:
        """One result per file, in collection order; a started file without an end is
        reported as interrupted."""
        now = time.time()
        for job in self._launched:
            job.settle(FileStatus.INTERRUPTED)
            if job.result.end is None:
                job.result.end = now
        return [job.result for job in self._jobs]


def run_files(files: Sequence[TestFile], options: SchedulerOptions,
              console: Console | None = None) -> tuple[list[FileResult], Scheduler]:
    """Run ``files`` to the end (or to Ctrl+C) and return their results and the scheduler.

    Temporary files (per-file temp dirs, logs without ``log_dir``) are removed on every path.
    """
    scheduler = Scheduler(files, options, console)
    scratch = Path(tempfile.mkdtemp(prefix="toolrl-sched-", dir=local_temp_root()))
    try:
        try:
            asyncio.run(scheduler.run(scratch))
        except KeyboardInterrupt:  # a second Ctrl+C during the orderly stop
            scheduler.interrupted = True
        finally:
            scheduler.kill_everything()
        results = scheduler.results()
        scheduler.console.print(summary_table(results, scheduler))
        scheduler._say(summary_line(results, scheduler.wall_s), "bold")
        for result in results:
            if result.status in (FileStatus.FAILED, FileStatus.TIMED_OUT) and options.log_dir:
                scheduler._say(f"log of {result.path}: {result.log}", "dim")
        return results, scheduler
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def summary_table(results: Sequence[FileResult], scheduler: Scheduler) -> Table:
    table = Table(title="test files", show_lines=False)
    table.add_column("file", overflow="fold")
    table.add_column("needs", justify="right")
    table.add_column("devices")
    table.add_column("status")
    table.add_column("time (s)", justify="right")
    table.add_column("exit", justify="right")
    for r in results:
        table.add_row(scheduler._name(r.path), str(r.devices_needed), ",".join(r.devices),
                      Text(r.status.value, style=_STYLES[r.status]),
                      "" if r.duration_s is None else f"{r.duration_s:.1f}",
                      "" if r.returncode is None else str(r.returncode))
    return table


def summary_line(results: Sequence[FileResult], wall_s: float) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    return f"{len(results)} files: {parts} in {wall_s:.1f}s"


def exit_code(results: Sequence[FileResult], interrupted: bool) -> int:
    if interrupted or any(r.status is FileStatus.INTERRUPTED for r in results):
        return EXIT_INTERRUPTED
    return 0 if all(r.status.ok for r in results) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.gpu_scheduler",
        description="Pack test files onto free devices by their declared need "
                    "(DEVICES = N or @pytest.mark.devices(N)); arguments after -- go to pytest.")
    parser.add_argument("paths", nargs="*", default=["tests"], help="test files or directories")
    parser.add_argument("--devices", default="auto",
                        help="a count (4), ids (0,1,2,3; one id: 3,), or auto: "
                             "CUDA_VISIBLE_DEVICES, nvidia-smi, torch.cuda (default)")
    parser.add_argument("--default-devices", type=int, default=1,
                        help="need of a file that declares none (default 1; 0 for CPU files)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per file")
    parser.add_argument("--heartbeat", type=float, default=60.0,
                        help="print running files every N seconds (0: off)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="most files at once (default: one per device)")
    parser.add_argument("--kill-grace", type=float, default=5.0,
                        help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="keep every file's pytest output here")
    parser.add_argument("--no-loopback-guard", action="store_true",
                        help="do not pin NCCL/Gloo to lo on hosts that cannot reach their own IP")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    try:
        if args.timeout <= 0 or args.heartbeat < 0 or (args.jobs is not None and args.jobs < 1):
            raise ValueError("--timeout must be > 0, --heartbeat >= 0 and --jobs >= 1")
        devices = resolve_devices(args.devices)
        files = collect(args.paths, default_devices=args.default_devices)
    except (CollectError, InventoryError, ValueError, OSError) as exc:
        print(f"test-scheduler: {exc}", file=sys.stderr)
        return 2
    if not files:
        print(f"test-scheduler: no test files under {args.paths}", file=sys.stderr)
        return 2
    options = SchedulerOptions(
        devices=tuple(devices), timeout_s=args.timeout, heartbeat_s=args.heartbeat,
        pytest_args=tuple(pytest_args), jobs=args.jobs, kill_grace_s=args.kill_grace,
        log_dir=args.log_dir, loopback_guard=not args.no_loopback_guard)
    # Logs (CI, files) are wide: a non-terminal gets 160 columns unless COLUMNS says otherwise.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    console = Console(highlight=False, width=160 if wide else None)
    console.print(Text(f"{len(files)} files on {len(devices)} devices "
                       f"[{','.join(devices)}], timeout {args.timeout:g}s", style="bold"))
    results, scheduler = run_files(files, options, console)
    return exit_code(results, scheduler.interrupted)
