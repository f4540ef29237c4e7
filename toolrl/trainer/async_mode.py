"""Asynchronous training on split pools (``trainer.mode: async``), after AReaL and verl's
fully-async trainer.

The rollout workers never stop generating: each runs an `toolrl.rollout.stream.EpisodeStream`
fed with whole GRPO groups; finished groups stream back to the driver; a step trains as soon as
its batch can be formed; new weights are pushed while generation goes on (the engine freezes
its requests in flight for the load, then they continue under the new weights)::

    rollout pool   [g1 g2 g3 g4 ...  g9 g10 ... | push | ... g17 ...    | push | ...]
    train pool          [train on 4 finished groups] [train on the next 4]

`toolrl.trainer.async_buffer.GroupBuffer` owns the rules: how much may be outstanding, which
groups a step trains (every due group, then the others in arrival order: no bias toward short
episodes), what happens to a straggler (``trainer.stale_policy``), and the accounting (every
group counted in and out). Every sample carries the version its group started with, and every
sampled token the version that sampled it (``TOKEN_VERSIONS``; tokens after a push that landed
inside a request have the new one): a step never trains a token more than
``trainer.max_staleness`` versions old (`toolrl.trainer.staleness`; ``async/staleness_*`` per
group, ``async/token_staleness_*`` and ``async/token_lag_<k>`` per trained token). The buffer
admits a group by its oldest trained token; a group past the bound is dropped whole, never
trained in part. ``actor.loss.corrections`` correct the lag (a config without one is refused
unless ``trainer.allow_uncorrected``).

The rest is `PipelineSchedule`'s: the split pools, the weight-sync group, the pool restart of
``trainer.on_rollout_failure: retry`` (the groups in flight are generated again on the new
pool; finished ones stay in the buffer), and `Trainer.learn` for reward, log-probs, advantage
and update.

A checkpoint records the loader's position after the groups submitted so far and the groups
still outstanding (submitted, not trained nor dropped): a resumed run submits those again
first (same uid, row and seed; their staleness clock restarts at the resumed version), then
goes on from the loader's position, so every row is trained exactly once, as without the
interruption.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from typing import TYPE_CHECKING, Any

from toolrl import batch as B
from toolrl.rollout.stream import FinishedGroup, GroupJob
from toolrl.rollout.worker import RolloutWorker
from toolrl.trainer.async_buffer import GroupBuffer, Ticket
from toolrl.trainer.failures import RolloutFailedError, describe
from toolrl.trainer.pipeline import PipelineSchedule
from toolrl.trainer.schedule import timed
from toolrl.trainer.staleness import (
    check_bound,
    oldest_version,
    token_lags,
    token_staleness_metrics,
)
from toolrl.workers.actor import ActorWorker

if TYPE_CHECKING:
    from toolrl.trainer.trainer import Trainer

POLL_S = 0.5  # the longest one poll of the workers waits for a finished group


class AsyncSchedule(PipelineSchedule):
    """``trainer.mode: async``: the pipeline's pools, the rollout pool streaming groups into a
    `GroupBuffer`."""

    keep_inflight = True  # weight pushes freeze the stream's requests, never wait for them

    def __init__(self, trainer: Trainer) -> None:
        super().__init__(trainer)
        self.buffer: GroupBuffer | None = None
        self._where: dict[str, int] = {}  # uid -> the rollout worker generating it
        self._resumed: list[GroupJob] = []  # outstanding at the checkpoint: submitted first

    # --- the stream ------------------------------------------------------------------------
    def top_up(self) -> None:
        """Submit steps' worth of groups while the buffer allows (`GroupBuffer.may_submit`):
        the groups outstanding at the checkpoint a run resumed from first, then new ones."""
        buf = self.ensure_buffer()
        per_step = self.t.cfg.data.batch_size
        while buf.may_submit(self.version):
            jobs, self._resumed = self._resumed[:per_step], self._resumed[per_step:]
            jobs += self.new_jobs(per_step - len(jobs))
            self.dispatch(buf.submit([j.uid for j in jobs], self.version, jobs))

    def new_jobs(self, count: int) -> list[GroupJob]:
        """The next ``count`` groups of the loader, named uniquely (across resumes too)."""
        if count <= 0:
            return []
        at = self.t.loader.state_dict()
        rows = self.t.loader.next_batch(count)
        seed = self.t.seed_of(f"train@{at['epoch']}", at["index"])
        n = self.t.cfg.algorithm.group_size
        return [GroupJob(f"{row.get('id', 'task')}@{at['epoch']}.{at['index'] + i}", dict(row),
                         n, None if seed is None else
                         zlib.crc32(f"{seed}:{i}".encode()) % (2**31 - 1))
                for i, row in enumerate(rows)]

    def state(self) -> dict[str, Any]:
        """The groups outstanding now (generated again on resume)."""
        outstanding = [] if self.buffer is None else \
            [dataclasses.asdict(t.job) for t in self.buffer.outstanding.values()]
        return {"async_outstanding": outstanding}

    def load_state(self, state: dict[str, Any]) -> None:
        self._resumed = [GroupJob(**job) for job in state.get("async_outstanding", [])]
        if self._resumed:
            self.t.console.log(f"async: {len(self._resumed)} groups outstanding at the "
                             f"checkpoint are generated again")

    def dispatch(self, tickets: list[Ticket]) -> None:
        """Send each group to the rollout worker with the fewest outstanding groups."""
        rollout = self.t.handles["rollout"]
        load = [0] * rollout.world_size
        for w in self._where.values():
            load[w] += 1
        per_worker: list[list[GroupJob]] = [[] for _ in load]
        for t in tickets:
            w = min(range(len(load)), key=load.__getitem__)
            per_worker[w].append(t.job)
            self._where[t.uid] = w
            load[w] += 1
        try:
            rollout.call(RolloutWorker.stream_submit, per_worker)
        except Exception as e:
            raise RolloutFailedError(f"submitting groups to the rollout pool failed "
                                     f"({describe(e)})") from e

    def poll(self, wait_s: float = POLL_S) -> int:
        """Move the finished groups of every worker into the buffer; returns how many."""
        buf = self.ensure_buffer()
        try:
            per_worker = self.t.handles["rollout"].call(RolloutWorker.stream_poll, wait_s)
        except Exception as e:
            raise RolloutFailedError(f"a rollout worker failed mid-stream ({describe(e)})"
                                     ) from e
        got: list[FinishedGroup] = [g for groups in per_worker for g in groups]
        for g in got:  # a group is as old as its oldest trained token
            buf.arrive(g.uid, g, oldest_version(g.batch, g.start_version))
            self._where.pop(g.uid, None)
        return len(got)

    def take_batch(self) -> list[Ticket]:
        """Poll until `GroupBuffer.select` forms this step's batch (at most
        ``trainer.call_timeout_s``)."""
        buf = self.ensure_buffer()
        deadline = time.perf_counter() + self.t.cfg.trainer.call_timeout_s
        self.poll(0.0)
        while True:
            selection = buf.select(self.version)
            if selection.cancel:
                self.cancel(selection.cancel)
            if selection.train is not None:
                return selection.train
            if time.perf_counter() > deadline:
                raise RolloutFailedError(
                    f"no batch for step {self.t.step + 1} within trainer.call_timeout_s="
                    f"{self.t.cfg.trainer.call_timeout_s:g} s ({buf.metrics()})")
            self.poll()

    def cancel(self, uids: list[str]) -> None:
        """Stop generating groups the buffer dropped (``stale_policy: drop``)."""
        self.t.handles["rollout"].call(RolloutWorker.stream_cancel, uids)
        for uid in uids:
            self._where.pop(uid, None)

    def ensure_buffer(self) -> GroupBuffer:
        if self.buffer is None:
            self.buffer = GroupBuffer(self.t.cfg.data.batch_size, self.t.cfg.trainer.max_staleness,
                                      self.t.cfg.trainer.stale_policy, start_version=self.version)
        return self.buffer

    # --- one step ------------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """Take a batch of finished groups (generation goes on), learn, push the weights."""
        timing: dict[str, float] = {}
        with timed(timing, "rollout"):  # the wait for the batch, not the generation
            tickets = self.batch_or_retry()
            batch = B.concat([t.result.batch for t in tickets])
            batch, infra = self.t.settle(batch)
        self.top_up()  # the next groups generate while this step trains
        metrics = self.stream_metrics(tickets)
        if batch is not None:
            metrics.update(self.token_metrics(batch))
        metrics.update(self.t.learn(batch, timing) if batch is not None
                       else self.t.learned_nothing())
        metrics.update(infra)
        with timed(timing, "sync"):
            metrics["policy_version"] = float(self.sync_weights())
            metrics["async/push_pause_s"] = max(
                self.t.handles["rollout"].call(RolloutWorker.last_push_pause_s))
            metrics.update(self.t.check_sync(int(metrics["policy_version"])))
        self.top_up()
        self.ensure_buffer().check()
        metrics.update(self.ensure_buffer().metrics())
        metrics.update({f"timing/{k}_s": v for k, v in timing.items()})
        return metrics

    def batch_or_retry(self) -> list[Ticket]:
        """`take_batch`; a failed stream restarts the rollout pool and submits the unfinished
        groups again (``trainer.on_rollout_failure: retry``), or stops the run."""
        while True:
            try:
                self.top_up()
                return self.take_batch()
            except RolloutFailedError as e:
                self.t.retry_or_stop(e)
                self.restart_rollout()
                # the new engines get the actor's current weights under the same version
                self.t.actor.call(ActorWorker.set_policy_version, self.version - 1)
                self.sync_weights()
                unfinished = self.ensure_buffer().unfinished()
                self._where.clear()
                if unfinished:
                    self.dispatch(unfinished)

    def stream_metrics(self, tickets: list[Ticket]) -> dict[str, float]:
        """Per-sample lag behind the actor that trains on them; groups a push landed in."""
        lags = [self.version - t.start_version for t in tickets]  # type: ignore[operator]
        if lags and (max(lags) > self.t.cfg.trainer.max_staleness or min(lags) < 0):
            raise RuntimeError(f"async staleness out of [0, {self.t.cfg.trainer.max_staleness}]: "
                               f"{sorted(set(lags))}")
        partial = [t.result.partial for t in tickets]
        return {"async/staleness_max": float(max(lags, default=0)),
                "async/staleness_mean": float(sum(lags) / max(len(lags), 1)),
                "async/partial_groups": float(sum(partial)),
                "async/group_s_max": max((t.result.seconds for t in tickets), default=0.0)}

    def token_metrics(self, batch: Any) -> dict[str, float]:
        """Per trained token: the lag behind the actor that trains on it (the bound holds on
        every one; past it is a bug and raises)."""
        k = self.t.cfg.trainer.max_staleness
        lags = token_lags(batch, self.version)
        check_bound(lags, k, "async staleness")
        return token_staleness_metrics(lags, k, "async")

    def stall_waits(self) -> list[str]:
        """The groups each rollout worker has not finished."""
        per_worker: dict[int, int] = {}
        for w in self._where.values():
            per_worker[w] = per_worker.get(w, 0) + 1
        pids = self.t.handles["rollout"].group.pids if "rollout" in self.t.handles else []
        return [f"{n} group(s) unfinished on rollout worker {w} (pid "
                f"{pids[w] if w < len(pids) else '?'})" for w, n in sorted(per_worker.items())]

    # --- lifetime ------------------------------------------------------------------------------
    def stop(self) -> None:
        self.stop_stream()

    def stop_stream(self) -> dict[str, Any]:
        """Cancel the groups still generating; returns the final accounting."""
        out: dict[str, Any] = {}
        if "rollout" in self.t.handles and self.buffer is not None:
            try:
                self.t.handles["rollout"].call_async(RolloutWorker.stream_stop).get(
                    timeout=10 if self.t.stalled else None)
            except Exception as e:  # a dead worker: its group is killed at shutdown
                self.t.console.log(f"stopping the episode stream: {e}")
            out = self.buffer.metrics()
            self.t.console.log(f"async: {out['async/submitted']:.0f} groups submitted, "
                             f"{out['async/trained']:.0f} trained, "
                             f"{out['async/dropped_stale']:.0f} dropped as stale, "
                             f"{len(self.buffer.outstanding)} unused at the end")
        return out


__all__ = ["AsyncSchedule"]
