"""The worker-group errors, in a module without Ray: code that only catches them (the trainer's
failure rules) imports on a machine without Ray."""

from __future__ import annotations


class WorkerGroupError(RuntimeError):
    """A worker group could not start or lost a worker."""


class WorkerDiedError(WorkerGroupError):
    """A worker process died (crash, OOM kill, node loss); the message names role and rank."""


class WorkerTimeoutError(WorkerGroupError, TimeoutError):
    """A call did not finish within its timeout; the message names the ranks still running."""


__all__ = ["WorkerDiedError", "WorkerGroupError", "WorkerTimeoutError"]
