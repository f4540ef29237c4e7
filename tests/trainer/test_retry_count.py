"""``trainer.max_retries`` counts failures of one step in a row: the steps a restart redoes
from an earlier checkpoint are not progress (issue 49: a stall that repeated at step 2 was
retried forever, since the redone step 1 reset the count)."""

from __future__ import annotations

from toolrl.trainer.failures import RetryCount


def test_a_failure_that_repeats_at_the_same_step_runs_out_of_retries():
    count = RetryCount(max_retries=2)
    for _ in range(2):
        assert count.allows()
        count.failed(step=1)  # step 2 failed after step 1 trained; back to step 0
        count.step_done(1)  # the redone step 1: not past the failure
    assert not count.allows()
    assert count.total == 2


def test_progress_past_the_failed_step_starts_a_new_row():
    count = RetryCount(max_retries=1)
    count.failed(step=1)
    count.step_done(1)
    assert not count.allows()
    count.step_done(2)  # step 2, the one that failed, now trained
    assert count.allows() and count.total == 1


def test_no_retries_allowed():
    assert not RetryCount(max_retries=0).allows()
