"""`EpisodeStream`: a rollout worker that never stops generating (``trainer.mode: async``).

The driver hands the worker whole GRPO groups (`GroupJob`: one task row, its group size, its
uid and seed); the stream runs them on an event loop of its own (a daemon thread), at most
``max_groups`` at once, while the worker's Ray calls go on beside it: the driver polls the
finished groups (`poll`), cancels groups it gave up on (`cancel`) and pushes new weights
(`RolloutWorker.receive_weights` with ``keep_inflight``: the engine freezes the requests in
flight for the load and resumes them under the new weights).

A finished group (`FinishedGroup`) is the rollout batch of its samples, stamped with the
policy version the engine had when the group started (``POLICY_VERSION`` and each
trajectory's ``policy_version``): the oldest weights any of its tokens can come from, so the
trainer's staleness bound is conservative. ``end_version`` tells whether a push landed while
it ran (a partial rollout: tokens before the push keep the log-probs of the old weights,
tokens after it have the new ones, each as sampled). A group whose generation raised is
reported by `poll` (the worker's call fails, the driver applies
``trainer.on_rollout_failure``); episodes the infrastructure failed are ordinary samples
with ``infra_failure`` set, as in every mode.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from toolrl import batch as B
from toolrl.core.background import BackgroundLoop

RunGroup = Callable[["GroupJob"], Awaitable[TensorDict]]
"""Generates one group's rollout batch (e.g. `RolloutWorker.arollout` of its rows)."""


@dataclass(frozen=True)
class GroupJob:
    """One GRPO group to generate: ``n`` episodes of ``row``, sharing ``uid``."""

    uid: str
    row: dict[str, Any]
    n: int
    seed: int | None = None


@dataclass
class FinishedGroup:
    """A generated group: its rollout ``batch``, the engine's policy version when it started
    and when it ended, and its wall-clock seconds."""

    uid: str
    batch: TensorDict
    start_version: int
    end_version: int
    seconds: float

    @property
    def partial(self) -> bool:
        """A weight push landed while the group was generated."""
        return self.end_version != self.start_version


class StreamError(RuntimeError):
    """A group's generation raised (not an infra-failed episode: the episode loop itself)."""


class EpisodeStream:
    """Generates submitted groups continuously on a background loop; thread-safe.

    Args:
        run_group: turns a `GroupJob` into its rollout batch (a coroutine; it runs on the
            stream's loop).
        version: the engine's current policy version.
        max_groups: groups generated at once (the rest wait in submission order).
    """

    def __init__(self, run_group: RunGroup, version: Callable[[], int],
                 max_groups: int) -> None:
        if max_groups < 1:
            raise ValueError(f"max_groups must be >= 1, got {max_groups}")
        self._run_group = run_group
        self._version = version
        self._loop = BackgroundLoop("toolrl-episode-stream").start()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._done: deque[FinishedGroup] = deque()
        self._errors: list[str] = []
        self._tasks: dict[str, concurrent.futures.Future[Any]] = {}
        self._sem: asyncio.Semaphore | None = None
        self._max_groups = max_groups
        self.cancelled = 0
        self._closed = False

    # --- driver side ----------------------------------------------------------------------
    def submit(self, jobs: Iterable[GroupJob]) -> int:
        """Queue ``jobs`` (generation starts as slots free up); returns the groups in flight."""
        with self._lock:
            if self._closed:
                raise StreamError("the episode stream is stopped")
            for job in jobs:
                if job.uid in self._tasks:
                    raise ValueError(f"group {job.uid!r} is already in the stream")
                self._tasks[job.uid] = self._loop.submit(self._one(job))
            return len(self._tasks)

    def poll(self, wait_s: float = 0.0, max_groups: int | None = None) -> list[FinishedGroup]:
        """The groups finished since the last poll (oldest first), waiting up to ``wait_s``
        for the first one; raises `StreamError` if a group's generation raised."""
        deadline = time.monotonic() + wait_s
        with self._ready:
            while not self._done and not self._errors:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._ready.wait(left)
            if self._errors:
                raise StreamError("; ".join(self._errors))
            out: list[FinishedGroup] = []
            while self._done and (max_groups is None or len(out) < max_groups):
                out.append(self._done.popleft())
            return out

    def cancel(self, uids: Iterable[str]) -> int:
        """Stop generating these groups (unknown or finished uids are ignored); returns how
        many were cancelled. A finished but unpolled group is discarded too."""
        n = 0
        with self._lock:
            for uid in uids:
                task = self._tasks.pop(uid, None)
                if task is not None:
                    task.cancel()
                    n += 1
                kept = [g for g in self._done if g.uid != uid]
                if len(kept) != len(self._done):
                    n += 1
                    self._done = deque(kept)
            self.cancelled += n
        return n

    @property
    def in_flight(self) -> int:
        """Groups submitted and not yet finished."""
        with self._lock:
            return len(self._tasks)

    def stop(self, timeout: float = 30.0) -> int:
        """Cancel every group and stop the loop; returns the groups that were in flight."""
        with self._lock:
            self._closed = True
            tasks = list(self._tasks.values())
            self._tasks.clear()
        with contextlib.suppress(Exception):  # each episode closes its env before the loop goes
            self._loop.run_sync(_cancel_all(), timeout=timeout)
        self._loop.stop()
        return len(tasks)

    # --- the loop side --------------------------------------------------------------------
    async def _one(self, job: GroupJob) -> None:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self._max_groups)
        async with self._sem:
            start_version = self._version()
            start = time.perf_counter()
            try:
                batch = await self._run_group(job)
            except asyncio.CancelledError:
                if self._asked_to_cancel(job.uid):
                    raise
                # something under the group cancelled it (a request the engine dropped): a
                # failed group the poller hears of, never one that silently stays in flight
                self._fail(job.uid, "CancelledError: its generation was cancelled, not by "
                                    "the stream (the engine dropped a request?)")
                return
            except Exception as e:
                self._fail(job.uid, f"{type(e).__name__}: {e}")
                return
            done = FinishedGroup(job.uid, stamp_version(batch, start_version), start_version,
                                 self._version(), time.perf_counter() - start)
        with self._ready:
            if self._tasks.pop(job.uid, None) is None:  # cancelled meanwhile
                return
            self._done.append(done)
            self._ready.notify_all()


    def _asked_to_cancel(self, uid: str) -> bool:
        """Whether the group's own task is being cancelled (`cancel`, `stop`)."""
        task = asyncio.current_task()
        with self._lock:
            return uid not in self._tasks or (task is not None and task.cancelling() > 0)

    def _fail(self, uid: str, why: str) -> None:
        with self._ready:
            if self._tasks.pop(uid, None) is None:  # cancelled meanwhile
                return
            self._errors.append(f"group {uid!r}: {why}")
            self._ready.notify_all()


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def stamp_version(batch: TensorDict, version: int) -> TensorDict:
    """``batch`` with every sample's policy version (tensor and trajectory) set to
    ``version``."""
    n = B.batch_len(batch)
    batch.set(B.POLICY_VERSION, torch.full((n,), int(version), dtype=torch.long))
    trajs = [dataclasses.replace(t, policy_version=int(version)) for t in B.trajectories(batch)]
    B.set_non_tensor(batch, B.TRAJECTORIES, trajs)
    return batch


__all__ = ["EpisodeStream", "FinishedGroup", "GroupJob", "StreamError", "stamp_version"]
