"""The progress watchdog: a run whose steps stop finishing says so and stops (issue 32).

A thread of the driver watches the time since the last finished step (or since training
began). Past the bound (``trainer.watchdog``: ``first_step_s`` until ``after_steps`` steps
finished, then ``multiple`` x their median step time, never under ``floor_s``) it

1. writes the Python stacks of the driver (every thread, `faulthandler`) and of every worker
   (`toolrl.controller.RayWorkerGroup.dump_stacks`) into ``<run dir>/stalls/<time>/``;
2. prints ONE line on stderr naming the step, the driver's phase and the worker call it was
   waiting on (``stall: ...``);
3. with ``trainer.on_rollout_failure: retry`` and a retry left, a stall in the rollout is a
   rollout failure like a dead worker's, in every mode: the rollout workers are killed, the
   driver's wait on them fails, and the retry path restarts them and redoes the batch (the
   line says so; the clock starts again, with ``first_step_s`` as after a start). Otherwise it
4. interrupts the driver's main thread; `Trainer.fit` raises `StallError` (``toolrl train``
   exits 1). If the main thread has not left `fit` within ``grace_s`` (stuck in native code),
   the watchdog kills the run's worker processes and exits the process itself (exit 1).

Not `toolrl.core.watchdog`: that one makes child server processes die with their owner.
"""

from __future__ import annotations

import _thread
import contextlib
import faulthandler
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from toolrl.trainer.stopping import interrupt_now

EXIT_STALLED = 1


@dataclass
class WatchdogConfig:
    """``trainer.watchdog``: when a run that makes no progress is stopped.

    Attributes:
        enabled: run the watchdog.
        first_step_s: the bound until ``after_steps`` steps finished (the first step after a
            start or resume, with the validation before it).
        after_steps: steps whose median sets the bound from then on.
        multiple: the bound is ``multiple`` x the median step time ...
        floor_s: ... but never less than this.
        grace_s: after it fired, how long the driver gets to stop cleanly before the watchdog
            kills the workers and exits the process.
    """

    enabled: bool = True
    first_step_s: float = 3600.0
    after_steps: int = 3
    multiple: float = 10.0
    floor_s: float = 600.0
    grace_s: float = 120.0


class StallError(RuntimeError):
    """No step finished within the watchdog's bound (the message is its one line)."""


_phase = "start-up"


def note_phase(name: str) -> None:
    """What the driver does now (``rollout``, ``update``, ``sync``, ...), for the stall line."""
    global _phase
    _phase = name


def current_phase() -> str:
    return _phase


class ProgressWatchdog:
    """Watches step completions; see the module docstring.

    Args:
        config: the bounds.
        run_dir: stacks go to ``run_dir/stalls/``.
        step: the driver's current step (for the line).
        waits: what the driver waits on now, e.g. ``["RolloutWorker.rollout on group 'x' ranks
            [0] (pid 123)"]``.
        dump_workers: writes every worker's stacks into a directory; returns the files.
        kill_workers: the hard stop's last resort (the workers' processes).
        recover: the first resort, given the driver's phase: returns what it did to turn the
            stall into a failure the run retries (e.g. killed the rollout workers), or None.
        err: where the line goes (stderr).
    """

    def __init__(self, config: WatchdogConfig, run_dir: Path, step: Callable[[], int],
                 waits: Callable[[], list[str]],
                 dump_workers: Callable[[Path], list[Path]],
                 kill_workers: Callable[[], None] = lambda: None,
                 recover: Callable[[str], str | None] = lambda phase: None,
                 err: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.run_dir = Path(run_dir)
        self._step = step
        self._waits = waits
        self._dump_workers = dump_workers
        self._kill_workers = kill_workers
        self._recover = recover
        self._err = err or (lambda line: print(line, file=sys.stderr, flush=True))
        self._durations: list[float] = []
        self._last = time.monotonic()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired: StallError | None = None
        self.stacks_dir: Path | None = None

    # --- the driver's side ------------------------------------------------------------------
    def bound(self) -> float:
        """Seconds the current step may take."""
        c = self.config
        if len(self._durations) < max(c.after_steps, 1):
            return c.first_step_s
        return max(c.floor_s, c.multiple * statistics.median(self._durations))

    def step_done(self) -> None:
        """A step finished: the clock starts again."""
        now = time.monotonic()
        self._durations.append(now - self._last)
        self._durations = self._durations[-50:]
        self._last = now

    def restart_clock(self) -> None:
        """Start the clock again without counting a step (after a restart of the workers): the
        next step gets ``first_step_s``, as after a start."""
        self._durations.clear()
        self._last = time.monotonic()

    def start(self) -> ProgressWatchdog:
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self._watch, name="toolrl-progress-watchdog",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)

    # --- the watchdog's thread --------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stopped.is_set():
            left = self._last + self.bound() - time.monotonic()
            if left > 0:
                self._wake.wait(min(left, 5.0))
                continue
            if self.fire() is None:  # recovered: restarted workers get a first step's bound
                self.restart_clock()
                continue
            return

    def fire(self) -> StallError | None:
        """Dump the stacks, print the line; then recover (None) or interrupt the driver (and
        if that does not stop it within ``grace_s``, end the process)."""
        waited = time.monotonic() - self._last
        step = self._step() + 1
        phase = current_phase()
        waits = self._safe(self._waits, [])
        stamp = time.strftime("%Y%m%d-%H%M%S")
        where = self.run_dir / "stalls" / f"step_{step}-{stamp}"
        where.mkdir(parents=True, exist_ok=True)
        with open(where / f"driver-pid{os.getpid()}.txt", "w") as f:
            faulthandler.dump_traceback(f, all_threads=True)
        files = self._safe(lambda: self._dump_workers(where), [])
        self.stacks_dir = where
        on = "; ".join(waits) if waits else "no worker call in flight"
        line = (f"stall: no progress in step {step} for {waited:.0f} s (trainer.watchdog bound "
                f"{self.bound():.0f} s), phase {phase!r}, waiting on: {on}; stacks of the "
                f"driver and {len(files)} worker(s) in {where}")
        recovered = self._safe(lambda: self._recover(phase), None)
        if recovered:
            self._err(f"{line}; {recovered}")
            return None
        self.fired = StallError(line)
        self._err(line)
        if not self._interrupt_main():
            self._err(f"stall: SIGINT is ignored in this process (a background job that is not "
                      f"`toolrl train`): the driver cannot be interrupted; it ends after "
                      f"trainer.watchdog.grace_s={self.config.grace_s:g} s")
        if not self._stopped.wait(self.config.grace_s):
            self._err(f"stall: the driver did not stop within trainer.watchdog.grace_s="
                      f"{self.config.grace_s:g} s; killing the workers and exiting")
            self._safe(self._kill_workers, None)
            os._exit(EXIT_STALLED)
        return self.fired

    @staticmethod
    def _interrupt_main() -> bool:
        """KeyboardInterrupt in the main thread (Ray's waits check for it). With SIGINT
        ignored (a background job without ``toolrl train``'s handlers) nothing arrives, and
        the hard stop after ``grace_s`` ends the run: False then."""
        if not callable(signal.getsignal(signal.SIGINT)):
            return False
        interrupt_now()  # toolrl train's handler: at once, not at the step's end
        _thread.interrupt_main()
        return True

    def _safe(self, fn, default):  # type: ignore[no-untyped-def]
        try:
            return fn()
        except Exception as e:  # a report that half fails still gets its line out
            self._err(f"stall: {getattr(fn, '__name__', 'report')} failed: {e}")
            return default


@contextlib.contextmanager
def watching(dog: ProgressWatchdog | None) -> Iterator[ProgressWatchdog | None]:
    """Run ``dog`` for the block; a KeyboardInterrupt it caused leaves as its `StallError`."""
    if dog is None:
        yield None
        return
    dog.start()
    try:
        yield dog
    except KeyboardInterrupt:
        if dog.fired is not None:
            raise dog.fired from None
        raise
    finally:
        dog.stop()


__all__ = ["EXIT_STALLED", "ProgressWatchdog", "StallError", "WatchdogConfig",
           "current_phase", "note_phase", "watching"]
