"""How a training step is laid out in time (``trainer.mode``): the strategy a `Trainer`
composes, one per mode.

- `SyncSchedule` (``sync``): rollout, then learn, then push the weights, the roles colocated
  on one pool;
- `toolrl.trainer.pipeline.PipelineSchedule` (``pipeline``): the rollout on a pool of its own,
  one step ahead of training;
- `toolrl.trainer.async_mode.AsyncSchedule` (``async``): groups streamed without pause.

A schedule drives its trainer (``self.t``) through the trainer's public methods (``rollout``,
``settle``, ``learn``, ``check_sync``, ``retry_or_stop``, ...) and owns what its mode adds: where
the roles run, how the weights reach the engines, what a checkpoint records beside the step and
the data position, what the watchdog is told and what stops with the run. The trainer's loop
(validation, logging, health, checkpoints, failures) is the same in every mode.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from toolrl.controller import RoleSpec
from toolrl.rollout.worker import RolloutWorker
from toolrl.trainer.progress import note_phase
from toolrl.workers.actor import ActorWorker

if TYPE_CHECKING:
    from toolrl.trainer.trainer import Trainer

__all__ = ["SyncSchedule", "first", "timed"]


@contextmanager
def timed(timing: dict[str, float], key: str) -> Iterator[None]:
    """Time a phase of the step into ``timing[key]`` (the watchdog's line names it)."""
    start = time.perf_counter()
    note_phase(key)
    try:
        yield
    finally:
        timing[key] = time.perf_counter() - start


def first(values: Any) -> Any:
    """DP_SPLIT_RAW / ONE_TO_ALL results: every rank returns the same (reduced) value."""
    return values[0] if isinstance(values, list) else values


class SyncSchedule:
    """``trainer.mode: sync``: every role on one pool; a step generates, learns, then pushes."""

    retries_in_step = False  # a failed rollout reaches `Trainer.recover` (redo or restart)

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer

    # --- workers ---------------------------------------------------------------------------
    def spawn_roles(self, roles: dict[str, RoleSpec]) -> None:
        """Place the run's roles (here: all colocated on the run's one pool)."""
        self.t.spawn_roles(roles)

    def workers_started(self) -> None:
        """Called once the roles run (the split modes join their weight-sync group here)."""

    # --- one step --------------------------------------------------------------------------
    @property
    def sleep_level(self) -> int:
        """vLLM sleep level of the colocated GPU engines while the actor trains (0: awake)."""
        e = self.t.rollout_config().engine
        return int(e.sleep_level) if e.enable_sleep_mode else 0

    def train_step(self) -> dict[str, float]:
        """rollout -> reward -> log-probs -> advantage -> update -> sync."""
        timing: dict[str, float] = {}
        self.t.step_data = self.t.loader.state_dict()  # a retried step draws the same rows
        rows = self.t.loader.next_batch()
        with timed(timing, "rollout"):
            batch = self.t.rollout(rows, self.t.cfg.algorithm.group_size,
                                   seed=self.t.seed_of("train"))
            batch, infra = self.t.settle(batch)  # infra failures: refilled or dropped
        if self.sleep_level:  # GPU: the engine's weights and KV cache make room for the update
            self.t.handles["rollout"].call(RolloutWorker.sleep, self.sleep_level)
        metrics = self.t.learn(batch, timing) if batch is not None else self.t.learned_nothing()
        metrics.update(infra)
        with timed(timing, "sync"):
            metrics["policy_version"] = float(self.sync_weights())
            metrics.update(self.t.check_sync(int(metrics["policy_version"])))
        metrics.update({f"timing/{k}_s": v for k, v in timing.items()})
        return metrics

    def sync_weights(self) -> int:
        """Actor -> rollout engines (in-process: the roles share the pool); the new version.
        A sleeping engine wakes its weights first and its KV cache after the push."""
        rollout = self.t.handles["rollout"]
        if self.sleep_level:
            rollout.call(RolloutWorker.wake_up, ["weights"])
        version = int(first(self.t.actor.call(ActorWorker.push_weights_local)))
        if self.sleep_level:
            rollout.call(RolloutWorker.wake_up, ["kv_cache"])
        return version

    # --- what the run adds to checkpoints, the watchdog and the stop ---------------------------
    @contextmanager
    def checkpoint_position(self) -> Iterator[None]:
        """The data position a checkpoint records is the trainer's loader as it is."""
        yield

    def state(self) -> dict[str, Any]:
        """What a checkpoint records for this schedule beside the step and the data."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Take back what `state` recorded (a resumed run)."""

    def stall_waits(self) -> list[str]:
        """What the schedule waits for besides the driver's worker calls (the stall line)."""
        return []

    def stop(self) -> None:
        """The run ends (its workers still up): stop what the schedule keeps running."""
