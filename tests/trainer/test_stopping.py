"""`toolrl.trainer.stopping` with real signals sent to this process: the first SIGTERM or
SIGINT inside the loop is a request (the loop ends the step and saves), a second one or the
grace running out interrupts at once, outside the loop a signal interrupts at once, the clean-up
after an interrupt ignores further signals, and the watchdog's interrupt is never counted as a
user's signal. (The whole path, a real ``toolrl train`` with its checkpoint, is
tests/faults/test_fault_stalls.py::test_a_signal_ends_the_run_cleanly.)"""

from __future__ import annotations

import _thread
import os
import signal
import time

import pytest

from toolrl.trainer.stopping import (
    interrupt_now,
    signals_stop_the_run,
    stop_requested,
    stoppable,
)


def send(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # the handler runs between bytecodes of the main thread


def test_a_signal_in_the_loop_is_a_request_and_a_second_one_interrupts():
    before = signal.getsignal(signal.SIGTERM)  # (Ray in this process may have installed one)
    with signals_stop_the_run() as state, stoppable(30):
        send(signal.SIGTERM)
        assert stop_requested() == signal.SIGTERM and not state.interrupted
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # the grace is running
        with pytest.raises(KeyboardInterrupt):
            send(signal.SIGTERM)
        assert state.interrupted and stop_requested() is None
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
        send(signal.SIGTERM)  # the clean-up: ignored
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are put back


def test_the_grace_running_out_interrupts():
    with signals_stop_the_run() as state, stoppable(0.2):
        send(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            time.sleep(5)
        assert state.signal == signal.SIGINT and state.interrupted


def test_outside_the_loop_or_without_a_grace_a_signal_interrupts_at_once():
    with signals_stop_the_run() as state:
        with pytest.raises(KeyboardInterrupt):
            send(signal.SIGTERM)
        assert state.signal == signal.SIGTERM
    with signals_stop_the_run() as state, stoppable(0):
        with pytest.raises(KeyboardInterrupt):
            send(signal.SIGINT)
        assert state.signal == signal.SIGINT


def test_the_watchdogs_interrupt_is_not_a_users_signal():
    with signals_stop_the_run() as state, stoppable(30):
        interrupt_now()
        with pytest.raises(KeyboardInterrupt):
            _thread.interrupt_main()
            time.sleep(1)
        assert state.signal is None and stop_requested() is None
