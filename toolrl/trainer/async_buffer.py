"""`GroupBuffer`: which groups the async trainer submits and which it trains, and when.

Pure bookkeeping (no Ray, no tensors), so the rule is tested on its own. Units are GRPO groups;
the driver submits them a step's worth at a time (``groups_per_step`` = ``data.batch_size``,
one *batch* ``b = 0, 1, ...`` counted from the version ``V0`` the run starts at), and one
training step takes ``groups_per_step`` of them. With the actor at version ``V`` and
``k = trainer.max_staleness``, the bound is split into a lookahead ``L`` and a slack ``s``
(``L + s = k + 1``; ``s = k // 2``, ``L = k + 1 - s``: k=0 is synchronous, k=1 the
one-step-off pipeline, streamed):

**Submission** (after AReaL's staleness control): batch ``b`` is submitted once
``b < V - V0 + L``, so at most ``L`` steps' worth of groups are outstanding and the workers
always have work.

**Admission** (what a step trains): every group has a deadline, ``V0 + b + s``. A step takes
every group at its deadline first, then the finished groups **in arrival order**, skipping a
group only where taking it would leave a later step more groups at their deadline than it can
take (earliest deadline first fills that place instead). Batch ``b`` is submitted at version
``>= V0 + b - L + 1`` and a group starts no earlier than it is submitted, so every trained
sample is at most ``L - 1 + s = k`` versions old.

Why not simply the first groups to finish: under tool latency episodes finish at very
different times; a trainer that always takes the first finished groups trains on the short
ones and the long ones come back stale and are dropped (or never win a place): the policy
learns from a distribution skewed toward short episodes. Here every submitted group trains
exactly once: a long episode trains later (by its deadline), never less often.

**Stragglers** (``trainer.stale_policy``), a group at its deadline that has not finished:
``continue`` (default): the step waits for it; meanwhile it keeps generating under each new
push of weights (a partial rollout: its tokens so far keep the log-probs they were sampled
with; the importance ratio against them corrects the loss). ``drop``: once the finished groups
can fill the batch without it, it is cancelled and counted (``async/dropped_stale``): steps
never wait on a straggler, at the price of losing the slowest episodes.

A group's version is that of its oldest trained token (`toolrl.trainer.staleness`: each
sampled token carries the version that sampled it, so a partial rollout counts by its oldest
part). A finished group older than ``k`` versions (possible only after a restarted rollout
pool) is dropped whole and counted, never trained, not even in part: its advantage was computed
over the whole episode and the group's baseline over all of its samples. Every group is counted
in and out: ``submitted = trained + dropped + outstanding``; a group arriving twice, or one
never submitted, raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

StalePolicy = Literal["continue", "drop"]
STALE_POLICIES: tuple[str, ...] = get_args(StalePolicy)


class BufferError(RuntimeError):
    """The buffer's accounting broke: a group arrived twice, or was never submitted."""


@dataclass
class Ticket:
    """One submitted group: its uid, the version it was submitted at, its job (to submit it
    again after a restart) and, once finished, its result and arrival number."""

    uid: str
    submit_version: int
    deadline: int
    job: Any = None
    result: Any = None
    start_version: int | None = None
    arrival: int | None = None

    @property
    def finished(self) -> bool:
        return self.arrival is not None


@dataclass
class Selection:
    """What `GroupBuffer.select` decided: the tickets to train (None: not ready yet, keep
    polling) and the uids to cancel and drop now."""

    train: list[Ticket] | None
    cancel: list[str] = field(default_factory=list)


class GroupBuffer:
    """The async trainer's submitted and finished groups (see the module docstring)."""

    def __init__(self, groups_per_step: int, max_staleness: int,
                 stale_policy: str = "continue", start_version: int = 0) -> None:
        if groups_per_step < 1:
            raise ValueError(f"groups_per_step must be >= 1, got {groups_per_step}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if stale_policy not in STALE_POLICIES:
            raise ValueError(f"stale_policy must be one of {STALE_POLICIES}, got "
                             f"{stale_policy!r}")
        self.groups_per_step = groups_per_step
        self.k = max_staleness
        self.slack = max_staleness // 2
        self.lookahead = max_staleness + 1 - self.slack
        self.policy = stale_policy
        self.start_version = start_version
        self.outstanding: dict[str, Ticket] = {}  # submitted, not trained nor dropped
        self.batches = 0
        self.submitted = 0
        self.trained = 0
        self.dropped_stale = 0  # too old when finished, or stragglers cancelled (drop)
        self._arrivals = 0
        self._done: set[str] = set()  # uids trained or dropped (a second arrival raises)

    # --- submission ------------------------------------------------------------------------
    def may_submit(self, version: int) -> bool:
        """Whether the next step's worth of groups may be submitted at ``version``."""
        return self.batches < version - self.start_version + self.lookahead

    def submit(self, uids: list[str], version: int, jobs: list[Any] | None = None
               ) -> list[Ticket]:
        """Submit one step's worth of groups (the next batch) at ``version``."""
        if len(uids) != self.groups_per_step:
            raise ValueError(f"a batch is {self.groups_per_step} groups, got {len(uids)}")
        if not self.may_submit(version):
            raise BufferError(f"batch {self.batches} submitted too early (version {version})")
        clash = [u for u in uids if u in self.outstanding or u in self._done]
        if clash or len(set(uids)) != len(uids):
            raise BufferError(f"groups {clash or uids} were submitted before")
        deadline = self.start_version + self.batches + self.slack
        tickets = [Ticket(u, version, deadline, j)
                   for u, j in zip(uids, jobs or [None] * len(uids), strict=True)]
        for t in tickets:
            self.outstanding[t.uid] = t
        self.batches += 1
        self.submitted += len(tickets)
        return tickets

    def arrive(self, uid: str, result: Any, start_version: int) -> None:
        """A group finished (``start_version``: the version of its oldest trained token, or
        the engine's when it started)."""
        ticket = self.outstanding.get(uid)
        if ticket is None:
            what = "arrived twice" if uid in self._done else "was never submitted"
            raise BufferError(f"group {uid!r} {what}")
        if ticket.finished:
            raise BufferError(f"group {uid!r} arrived twice")
        ticket.result, ticket.start_version = result, start_version
        ticket.arrival = self._arrivals
        self._arrivals += 1

    def unfinished(self) -> list[Ticket]:
        """Outstanding groups not finished (what a restarted pool must generate again)."""
        return [t for t in self.outstanding.values() if not t.finished]

    # --- admission -------------------------------------------------------------------------
    def select(self, version: int) -> Selection:
        """The batch of the step at ``version``, if it can be formed now (see the module
        docstring); drops and cancellations are applied to the counts at once."""
        cancel: list[str] = []
        for t in list(self.outstanding.values()):  # older than k: never trained
            if t.finished and version - int(t.start_version) > self.k:  # type: ignore[arg-type]
                self._drop(t)
        need = self.groups_per_step
        due = [t for t in self.outstanding.values() if t.deadline <= version]
        waiting = [t for t in due if not t.finished]
        if waiting and self.policy == "drop" and \
                sum(t.finished for t in self.outstanding.values()) >= need:
            for t in waiting:
                self._drop(t)
                cancel.append(t.uid)
            due = [t for t in due if t.finished]
            waiting = []
        if waiting:
            return Selection(None, cancel)
        taken = sorted(due, key=lambda t: t.arrival)[:need]
        ids = {t.uid for t in taken}
        for t in sorted((t for t in self.outstanding.values()
                         if t.finished and t.uid not in ids), key=lambda t: t.arrival):
            if len(taken) >= need:
                break
            if self._feasible(version, [*taken, t]):
                taken.append(t)
                ids.add(t.uid)
        for t in sorted(self.outstanding.values(), key=lambda t: (t.deadline, t.arrival or 0)):
            if len(taken) >= need:  # the rest: earliest deadline first, if finished
                break
            if t.finished and t.uid not in ids:
                taken.append(t)
                ids.add(t.uid)
        if len(taken) < need or not self._feasible(version, taken):
            return Selection(None, cancel)
        for t in taken:
            del self.outstanding[t.uid]
            self._done.add(t.uid)
        self.trained += len(taken)
        return Selection(taken, cancel)

    def _feasible(self, version: int, taken: list[Ticket]) -> bool:
        """After taking ``taken`` now (and filling the step), can every later step take all
        groups at its deadline? (At most ``groups_per_step`` more per step.)"""
        gone = {t.uid for t in taken}
        left = sorted(t.deadline for t in self.outstanding.values() if t.uid not in gone)
        free = self.groups_per_step - len(taken)  # places still open in this step
        for i, deadline in enumerate(left, start=1):  # i groups due by `deadline`
            if i > (deadline - version) * self.groups_per_step + free:
                return False
        return True

    def _drop(self, ticket: Ticket) -> None:
        del self.outstanding[ticket.uid]
        self._done.add(ticket.uid)
        self.dropped_stale += 1

    # --- accounting -----------------------------------------------------------------------
    def check(self) -> None:
        """Raise `BufferError` unless every submitted group is trained, dropped or
        outstanding, once."""
        if self.submitted != self.trained + self.dropped_stale + len(self.outstanding):
            raise BufferError(f"groups lost: {self.submitted} submitted, {self.trained} "
                              f"trained, {self.dropped_stale} dropped, "
                              f"{len(self.outstanding)} outstanding")

    def metrics(self) -> dict[str, float]:
        finished = sum(t.finished for t in self.outstanding.values())
        return {"async/submitted": float(self.submitted), "async/trained": float(self.trained),
                "async/dropped_stale": float(self.dropped_stale),
                "async/buffer_size": float(finished),
                "async/in_flight": float(len(self.outstanding) - finished)}


__all__ = ["STALE_POLICIES", "BufferError", "GroupBuffer", "Selection", "Ticket"]
