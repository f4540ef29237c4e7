"""One-step off-policy training on split pools (``trainer.mode: pipeline``), after AReaL.

The rollout workers get a resource pool of their own, so generation and training run at the
same time: while the actors train on batch k, the engines generate batch k+1 with the weights
the actors had before step k. When both are done, actor rank 0 broadcasts the new weights to
the engines over a dedicated process group (`toolrl.weights.group`: a gloo group on CPU whose
buckets land in the engine's staging files, vLLM's NCCL weight transfer into the engine's own
workers on GPU) and the next rollout starts with them::

    rollout pool   [batch 1, v0] [batch 2, v0 ] [batch 3, v1 ] [batch 4, v2 ]
    train pool                   [train 1, v0 ] [train 2, v1 ] [train 3, v2 ]
                                          sync v1        sync v2        sync v3

Every sample carries the version of the weights that generated it (``POLICY_VERSION``); a batch
is at most one version behind the actor that trains on it (``pipeline/staleness_max`` and
``pipeline/staleness_mean`` per step; a larger gap is a bug and raises). The lag is corrected
by ``actor.loss.corrections`` (`toolrl.algo.corrections`); a config without one is refused
unless it sets ``trainer.allow_uncorrected`` (`toolrl.trainer.config`).

The step reuses the sync trainer: `Trainer.learn` (reward, log-probs, advantage, update) runs
between launching the next rollout and syncing; validation, logging, checkpoints are
`Trainer.fit`'s. A rollout that fails (an exception, a dead or hung worker) stops the run with
`RolloutFailedError`, which names the worker: no step trains on a partial batch, and the step
that was training is neither synced nor logged. With ``trainer.on_rollout_failure: retry`` the
rollout pool alone is restarted (new workers, new engines), rejoins the weight-sync group and
gets the actor's current weights, and the failed batch is generated again from the same rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensordict import TensorDict

from toolrl import batch as B
from toolrl.controller import GroupFuture, RayWorkerGroup, ResourcePoolManager, RoleSpec, spawn
from toolrl.rollout.worker import RolloutWorker, make_rollout_input
from toolrl.trainer.failures import RolloutFailedError, describe
from toolrl.trainer.schedule import SyncSchedule, first, timed
from toolrl.trainer.staleness import check_bound, token_lags, token_staleness_metrics
from toolrl.workers.actor import ActorWorker

if TYPE_CHECKING:
    from toolrl.trainer.trainer import Trainer


@dataclass
class PendingRollout:
    """A batch being generated for ``step``; ``data_state`` is the loader's position before its
    rows were drawn (what a checkpoint records, so a resumed run generates it again)."""

    future: GroupFuture
    step: int
    data_state: dict[str, int]


class PipelineSchedule(SyncSchedule):
    """``trainer.mode: pipeline``: the rollout on its own pool, one step ahead of training."""

    keep_inflight = False  # pushes land between rollouts (async mode: while one runs)
    retries_in_step = True  # a failed rollout is redone on a restarted pool inside the step

    def __init__(self, trainer: Trainer) -> None:
        super().__init__(trainer)
        self.pending: PendingRollout | None = None
        self.version = 0  # the actor's policy version: pushes so far
        self.sync_backend = "nccl" if trainer.cfg.rollout.engine.backend == "gpu" else "gloo"
        self.weight_meta: list[tuple[str, str, tuple[int, ...]]] | None = None  # NCCL route

    # --- workers on two pools ------------------------------------------------------------------
    def workers_started(self) -> None:
        self.connect_weight_sync()

    def spawn_roles(self, roles: dict[str, RoleSpec]) -> None:
        """Actor, reference and critic share the ``train`` pool; rollout gets ``rollout``."""
        res = self.t.cfg.resources
        sizes = {"train": res.processes_per_node, "rollout": res.rollout_processes_per_node}
        mapping = {role: "rollout" if role == "rollout" else "train" for role in roles}
        pools = sorted(set(mapping.values()))
        manager = ResourcePoolManager.from_config({
            "pools": {p: [sizes[p]] * res.nodes for p in pools},
            "mapping": mapping, "use_gpu": res.device == "cuda",
            "cpus_per_process": res.cpus_per_process,
            "custom_resources": {p: res.pool_resources[p] for p in pools
                                 if p in res.pool_resources}})
        with self.t.console.status("starting workers (train and rollout pools)"):
            self.t.handles = spawn(manager, roles,
                                   call_timeout_s=self.t.cfg.trainer.call_timeout_s)

    def connect_weight_sync(self) -> None:
        """Actor rank 0 and every rollout worker join one broadcast group (a rendezvous: both
        sides are called at once)."""
        rollout = self.t.handles["rollout"]
        backend = self.sync_backend
        addr, port = self.t.actor.call(ActorWorker.weight_sync_endpoint, backend)
        world = 1 + rollout.world_size
        joins = [rollout.call_async(RolloutWorker.connect_weight_sync, addr, port, world,
                                    backend),
                 self.t.actor.call_async(ActorWorker.connect_weight_sync, addr, port, world,
                                         backend, self.t.rollout_config().engine.dtype)]
        for join in joins:
            join.get()
        self.version = int(self.t.actor.call(ActorWorker.policy_version))
        if backend == "nccl":
            self.weight_meta = self.t.actor.call(ActorWorker.weight_metadata)

    # --- one step ------------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """Train on batch k (made by the previous weights) while batch k+1 is generated; sync."""
        timing: dict[str, float] = {}
        if self.pending is None:  # the first step (or the first after a resume)
            self.pending = self.launch_rollout(self.t.step + 1)
        with timed(timing, "rollout"):  # only the part that did not overlap with training
            batch = self.collect_or_retry()
            batch, infra = self.t.settle(batch)
        more = self.t.step + 1 < self.t.cfg.trainer.total_steps
        self.pending = self.launch_rollout(self.t.step + 2) if more else None
        metrics = self.staleness(batch) if batch is not None else {}
        metrics.update(self.t.learn(batch, timing) if batch is not None
                       else self.t.learned_nothing())
        metrics.update(infra)
        relaunch = None
        with timed(timing, "rollout_next_wait"):  # engines must be idle to load weights
            if self.pending is not None:
                try:
                    self.collect(self.pending)
                except RolloutFailedError as e:  # this step trained: finish it, then redo
                    self.t.retry_or_stop(e)        # the next batch on the restarted pool
                    self.restart_rollout()
                    relaunch = self.pending
        with timed(timing, "sync"):
            metrics["policy_version"] = float(self.sync_weights())
            metrics.update(self.t.check_sync(int(metrics["policy_version"])))
        if relaunch is not None:
            self.pending = self.relaunch(relaunch)
        metrics.update({f"timing/{k}_s": v for k, v in timing.items()})
        return metrics

    def collect_or_retry(self) -> TensorDict:
        """The pending batch; a failed rollout is generated again on a restarted pool with the
        weights it had (``trainer.on_rollout_failure: retry``), or stops the run."""
        assert self.pending is not None
        while True:
            try:
                return self.collect(self.pending)
            except RolloutFailedError as e:
                self.t.retry_or_stop(e)
                self.restart_rollout()
                # the engines get the actor's current weights under the same version
                self.t.actor.call(ActorWorker.set_policy_version, self.version - 1)
                self.sync_weights()
                self.pending = self.relaunch(self.pending)

    def relaunch(self, pending: PendingRollout) -> PendingRollout:
        """Generate ``pending``'s batch again: the same rows (the loader rewinds to where they
        were drawn and ends where it was) and the same seed."""
        ahead = self.t.loader.state_dict()
        self.t.loader.load_state_dict(pending.data_state)
        again = self.launch_rollout(pending.step)
        if self.t.loader.state_dict() != ahead:
            raise RuntimeError("relaunch: the data loader did not end where it was")
        return again

    def restart_rollout(self) -> None:
        """Kill the rollout pool's workers, start new ones (new engines) on the same
        reservation and join them to the weight-sync group."""
        old = self.t.handles["rollout"]
        with contextlib.suppress(Exception):  # a dead or hung worker: killed below
            old.call_async(RolloutWorker.shutdown).get(timeout=60)
        old.group.shutdown()
        group = RayWorkerGroup(old.group.pool, {"rollout": RoleSpec.of(
            RolloutWorker, self.t.rollout_config())},
            call_timeout_s=self.t.cfg.trainer.call_timeout_s)
        self.t.handles["rollout"] = group.role("rollout")
        self.connect_weight_sync()
        self.t.console.log(f"rollout pool restarted (pids {group.pids})")

    def launch_rollout(self, step: int) -> PendingRollout:
        """Start generating the batch of ``step`` on the rollout pool; returns at once."""
        data_state = self.t.loader.state_dict()
        batch = make_rollout_input(self.t.loader.next_batch(), n=self.t.cfg.algorithm.group_size)
        future = self.t.handles["rollout"].call_async(
            RolloutWorker.rollout, batch, seed=self.t.seed_of("train", step - 1))
        return PendingRollout(future, step, data_state)

    def collect(self, pending: PendingRollout) -> TensorDict:
        """The finished batch; a failed rollout raises `RolloutFailedError` (no partial batch)."""
        try:
            return pending.future.get()
        except Exception as e:
            raise RolloutFailedError(
                f"rollout of the batch for step {pending.step} failed ({describe(e)})") from e

    def staleness(self, batch: TensorDict) -> dict[str, float]:
        """Per-sample and per-trained-token lag between the weights that generated ``batch``
        and the actor that is about to train on it (0 on-policy, 1 one step behind)."""
        lag = (self.version - batch[B.POLICY_VERSION]).float()
        if lag.numel() and (lag.max() > 1 or lag.min() < 0):
            raise RuntimeError(f"pipeline staleness out of [0, 1]: sample versions "
                               f"{sorted(set(batch[B.POLICY_VERSION].tolist()))}, actor "
                               f"version {self.version}")
        lags = token_lags(batch, self.version)
        check_bound(lags, 1, "pipeline staleness")
        return {"pipeline/staleness_max": float(lag.max()),
                "pipeline/staleness_mean": float(lag.mean()),
                **token_staleness_metrics(lags, 1, "pipeline")}

    def sync_weights(self, checksum: bool = False) -> int:
        """Actor rank 0 broadcasts the weights, every rollout engine loads them; returns the new
        version. ``checksum``: the workers keep `RolloutWorker.loaded_weights_checksum`."""
        expected = None  # the NCCL route carries no header: the receivers are told the version
        if self.weight_meta is not None:
            expected = int(self.t.actor.call(ActorWorker.policy_version)) + 1
        received = self.t.handles["rollout"].call_async(
            RolloutWorker.receive_weights, checksum=checksum, metadata=self.weight_meta,
            version=expected, keep_inflight=self.keep_inflight)
        pushed = self.t.actor.call_async(ActorWorker.push_weights)
        versions = received.get()  # first: a dead receiver fails here, not in a blocked push
        version = int(first(pushed.get()))
        if any(v != version for v in versions):
            raise RuntimeError(f"weight sync: actor pushed version {version}, rollout workers "
                               f"loaded {versions}")
        self.version = version
        return version

    # --- checkpoints ---------------------------------------------------------------------------
    @contextmanager
    def checkpoint_position(self) -> Iterator[None]:
        """The checkpoint's data position is the start of the batch in flight: a resumed run
        generates that batch again, with the restored weights."""
        if self.pending is None:
            yield
            return
        ahead = self.t.loader.state_dict()
        self.t.loader.load_state_dict(self.pending.data_state)
        try:
            yield
        finally:
            self.t.loader.load_state_dict(ahead)


__all__ = ["PendingRollout", "PipelineSchedule", "RolloutFailedError", "describe"]
