"""SIGTERM and SIGINT stop a run at the end of its step, with a checkpoint (issue 32).

`toolrl train` installs `signals_stop_the_run`. The first signal while `Trainer.fit` trains
(inside `stoppable`) is a request: the step in flight finishes, the loop writes a checkpoint
when steps finished since the last one, and `RunStopped` ends the run. If the step does not
finish within ``trainer.stop_grace_s`` (a SIGALRM timer), or a second signal comes, the run is
interrupted at once (``KeyboardInterrupt``; the step in flight is lost and redone from the last
checkpoint by ``trainer.resume=auto``). Outside the loop (start-up, warm start, validation at
step 0 included) a signal interrupts at once; during the clean-up that follows, more signals are
ignored. A preemption that sends SIGTERM and waits (Kubernetes, Slurm) gets the checkpoint.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class StopState:
    """What the signals asked so far (one run of `signals_stop_the_run`)."""

    signal: int | None = None  # the first signal received
    interrupted: bool = False  # KeyboardInterrupt raised: clean-up runs, signals are ignored
    grace_s: float = 0.0  # > 0 while the loop can stop at a step's end (`stoppable`)
    forced: bool = False  # the next SIGINT is the watchdog's `interrupt_now`, not a user's


_state = StopState()


class RunStopped(Exception):
    """The loop stopped at a step's end because a signal asked it to."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        saved = (f"checkpoint {checkpoint} written" if checkpoint is not None
                 else "no checkpoint written (no step finished since the last one)")
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}: {saved}")


def stop_requested() -> int | None:
    """The signal that asked the run to stop at its step's end, if one did."""
    return _state.signal if not _state.interrupted else None


@contextlib.contextmanager
def stoppable(grace_s: float) -> Iterator[None]:
    """The training loop: a signal inside waits up to ``grace_s`` for the step's end (0: no
    wait, the signal interrupts at once)."""
    _state.grace_s = grace_s
    try:
        yield
    finally:
        _state.grace_s = 0.0
        _disarm()


def interrupt_now() -> None:
    """The next SIGINT handled (``_thread.interrupt_main``) interrupts at once and is not
    counted as a user's signal (the progress watchdog's stop)."""
    _state.forced = True


def _disarm() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.setitimer(signal.ITIMER_REAL, 0)


def _interrupt() -> None:
    _state.interrupted = True
    _disarm()
    raise KeyboardInterrupt


def _on_signal(signum: int, frame: Any) -> None:
    if _state.forced and signum == signal.SIGINT:
        _state.forced = False
        raise KeyboardInterrupt
    if _state.interrupted:
        return  # the clean-up runs: it must not be interrupted in turn
    if _state.signal is not None:
        _interrupt()  # a second signal: stop now
    _state.signal = signum
    if _state.grace_s <= 0:
        _interrupt()
    signal.setitimer(signal.ITIMER_REAL, _state.grace_s)
    print(f"{signal.Signals(signum).name}: stopping after the step in flight, with a "
          f"checkpoint (at most trainer.stop_grace_s={_state.grace_s:g} s; send it again to "
          f"stop now)", file=sys.stderr, flush=True)


def _on_alarm(signum: int, frame: Any) -> None:
    if _state.signal is not None and not _state.interrupted:
        print(f"the step in flight did not finish within trainer.stop_grace_s="
              f"{_state.grace_s:g} s: stopping now", file=sys.stderr, flush=True)
        _interrupt()


@contextlib.contextmanager
def signals_stop_the_run() -> Iterator[StopState]:
    """Install the handlers for the block (SIGINT stays ignored where it was: a ``&`` job);
    yields the state, whose ``signal`` names the signal that stopped the run."""
    global _state
    _state = StopState()
    watched = (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)
    before = {s: signal.getsignal(s) for s in watched}
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGALRM, _on_alarm)
    if before[signal.SIGINT] is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _on_signal)
    try:
        yield _state
    finally:
        _disarm()
        for s, handler in before.items():
            signal.signal(s, handler)


__all__ = ["RunStopped", "StopState", "interrupt_now", "signals_stop_the_run", "stop_requested",
           "stoppable"]
