"""Episodes the infrastructure failed: kept out of the loss and the reward statistics.

An episode whose `Trajectory.infra_failure` is set (a tool server unreachable, an env that
raised or timed out, a crashed episode loop) says nothing about the policy: scoring it like a
wrong answer would teach the model that a flaky tool is its fault. `settle` takes a finished
rollout batch and, per ``trainer.infra_failures`` (`InfraFailureConfig`):

- counts the failures (``rollout/infra_failed`` and one ``rollout/infra_failed/<kind>`` per
  kind) and stops the run with `InfraFailureError` when more than ``max_fraction`` of the
  batch failed (a broken service, not bad luck). This is the only threshold over these
  episodes: the health check (``trainer.health``, `toolrl.trainer.health`) prints them but
  counts only the other errors;
- ``rule=refill``: runs the failed samples again (same task, same group, a new seed) up to
  ``refill_attempts`` times, then drops what still fails;
  ``rule=drop_sample``: drops the failed samples (their groups train on the rest);
  ``rule=drop_group``: drops every sample of a group that has a failed one.

Dropped samples never reach rewards, advantages or the update; what is left keeps its order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from tensordict import TensorDict

from toolrl import batch as B
from toolrl.controller.errors import WorkerGroupError

InfraRule = Literal["refill", "drop_sample", "drop_group"]
INFRA_RULES: tuple[str, ...] = get_args(InfraRule)


class InfraFailureError(RuntimeError):
    """Too many episodes of one batch failed for infrastructure reasons; the run stops."""


class RolloutFailedError(WorkerGroupError):
    """A rollout failed (a worker died, hung past its timeout or raised) and
    ``trainer.on_rollout_failure`` did not (or could no longer) retry it; the message names
    the worker and the step. No step trained on any part of the failed batch."""


@dataclass
class RetryCount:
    """Tries of ``trainer.on_rollout_failure: retry``: at most ``max_retries`` failures in a
    row. A retry that restarts the workers resumes from the last checkpoint and redoes the
    steps up to the one that failed; those are not progress, so only a step past the last
    failed one starts a new row (else a failure that repeats at the same step retries
    forever)."""

    max_retries: int
    in_a_row: int = 0
    total: int = 0
    failed_after: int = -1  # the last step trained before the latest failure

    def allows(self) -> bool:
        """Whether one more retry is allowed now."""
        return self.in_a_row < self.max_retries

    def failed(self, step: int) -> None:
        """A retry begins; ``step`` is the last step trained before the failure."""
        self.in_a_row += 1
        self.total += 1
        self.failed_after = max(self.failed_after, step)

    def step_done(self, step: int) -> None:
        if step > self.failed_after:
            self.in_a_row = 0


def describe(error: BaseException) -> str:
    """One line for an error from a worker group: its message's last line and Ray's notes
    (which name the group, role and rank)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    text = lines[-1] if lines else type(error).__name__
    notes = " ".join(getattr(error, "__notes__", []))
    return f"{type(error).__name__}: {text[:300]}" + (f" {notes}" if notes else "")


@dataclass
class InfraFailureConfig:
    """What the trainer does with episodes the infrastructure failed (see the module doc).

    Attributes:
        rule: refill | drop_sample | drop_group.
        refill_attempts: how often ``refill`` runs a failed sample again before dropping it.
        max_fraction: stop the run when more than this share of a batch (as first generated)
            failed for infrastructure reasons; 1.0 never stops.
    """

    rule: InfraRule = "refill"
    refill_attempts: int = 1
    max_fraction: float = 0.5

    # checked by `toolrl.trainer.config.validate`, which names the key path


def infra_failed(batch: TensorDict) -> list[int]:
    """Indices of the samples whose episode the infrastructure failed."""
    return [i for i, t in enumerate(B.trajectories(batch)) if t.infra_failure is not None]


Rerun = Callable[[list[dict[str, Any]], list[str], int], TensorDict]
"""``rerun(rows, uids, attempt)``: a rollout batch of one episode per row, with those uids."""


def settle(batch: TensorDict, config: InfraFailureConfig, rerun: Rerun | None = None,
           ) -> tuple[TensorDict | None, dict[str, float]]:
    """The batch to train on (None when nothing is left) and the ``rollout/infra_*`` metrics;
    raises `InfraFailureError` past ``config.max_fraction``. ``rerun`` is needed by
    ``rule=refill`` (see `Rerun`)."""
    trajs = B.trajectories(batch)
    n = len(trajs)
    failed = infra_failed(batch)
    kinds = Counter(trajs[i].infra_failure for i in failed)
    metrics: dict[str, float] = {"rollout/infra_failed": float(len(failed))}
    metrics.update({f"rollout/infra_failed/{k}": float(v) for k, v in sorted(kinds.items())})
    if not failed:
        return batch, metrics
    if len(failed) > config.max_fraction * n:
        examples = "; ".join(f"{trajs[i].infra_failure}: {trajs[i].error or _first_infra(trajs[i])}"
                             for i in failed[:3])
        raise InfraFailureError(
            f"{len(failed)} of {n} episodes failed for infrastructure reasons "
            f"({dict(kinds)}), more than trainer.infra_failures.max_fraction="
            f"{config.max_fraction:g}; the run stops before training on this batch. First "
            f"failures: {examples}")
    refilled = 0
    if config.rule == "refill" and rerun is not None:
        rows, uids = B.get_non_tensor(batch, B.ROWS), B.get_non_tensor(batch, B.UID)
        for attempt in range(1, config.refill_attempts + 1):
            if not failed:
                break
            fresh = rerun([dict(rows[i]) for i in failed], [uids[i] for i in failed], attempt)
            batch = replace_rows(batch, failed, fresh)
            still = set(infra_failed(fresh))
            metrics["rollout/infra_failed"] += len(still)
            refilled += len(failed) - len(still)
            failed = [i for k, i in enumerate(failed) if k in still]
    elif config.rule == "refill":
        raise ValueError("rule=refill needs a rerun function")
    if config.rule == "drop_group":
        uids = B.get_non_tensor(batch, B.UID)
        bad = {uids[i] for i in failed}
        drop = {i for i, u in enumerate(uids) if u in bad}
    else:
        drop = set(failed)
    metrics["rollout/infra_refilled"] = float(refilled)
    metrics["rollout/infra_dropped"] = float(len(drop))
    keep = [i for i in range(n) if i not in drop]
    if not keep:
        return None, metrics
    return (batch if not drop else B.select_rows(batch, keep)), metrics


def replace_rows(batch: TensorDict, index: list[int], fresh: TensorDict) -> TensorDict:
    """``batch`` with rows ``index`` replaced by the rows of ``fresh``, in order."""
    if B.batch_len(fresh) != len(index):
        raise ValueError(f"{B.batch_len(fresh)} new rows for {len(index)} places")
    n = B.batch_len(batch)
    order = torch.arange(n)
    order[torch.as_tensor(index, dtype=torch.long)] = torch.arange(n, n + len(index))
    return B.select_rows(B.concat([batch, fresh]), order)


def _first_infra(traj: Any) -> str:
    for error in traj.errors:
        if error.get("infra"):
            return f"{error.get('tool')}: {error.get('message')}"
    return "?"


__all__ = ["INFRA_RULES", "InfraFailureConfig", "InfraFailureError", "RolloutFailedError",
           "describe", "infra_failed", "replace_rows", "settle"]
