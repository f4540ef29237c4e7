"""Staleness counted on the tokens that train.

Every sampled response token carries the weight version that sampled it (``TOKEN_VERSIONS``:
vLLM labels each step's outputs with the engine's version, so a request a push landed in is
split into an old prefix and a new suffix). A token sampled by version ``v`` and trained by the
actor at version ``V`` is ``V - v`` versions stale. The bound of a mode (sync 0, pipeline 1,
async ``trainer.max_staleness``) holds on every trained token: the async buffer admits a group
by its oldest trained token (`oldest_version`) and drops a group past the bound whole, and a
token past the bound that still reaches a step is a bug that stops the run (`check_bound`).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from toolrl import batch as B

__all__ = ["check_bound", "oldest_version", "token_lags", "token_staleness_metrics"]


def token_lags(batch: TensorDict, version: int) -> torch.Tensor:
    """``version - TOKEN_VERSIONS`` on the batch's trained tokens (response mask 1), flat;
    empty when nothing trains or the batch has no per-token versions."""
    if B.TOKEN_VERSIONS not in batch:
        return torch.zeros(0, dtype=torch.long)
    mask = batch[B.RESPONSE_MASK].bool()
    return int(version) - batch[B.TOKEN_VERSIONS][mask].long()


def oldest_version(batch: TensorDict, default: int) -> int:
    """The oldest version among the batch's trained tokens (``default`` when it has none)."""
    if B.TOKEN_VERSIONS not in batch:
        return int(default)
    versions = batch[B.TOKEN_VERSIONS][batch[B.RESPONSE_MASK].bool()]
    return int(versions.min()) if versions.numel() else int(default)


def check_bound(lags: torch.Tensor, bound: int, what: str) -> None:
    """Raise unless every lag is in ``[0, bound]`` (a token trained by weights older than the
    ones that sampled it, or staler than the bound, is a bug)."""
    if lags.numel() and (int(lags.max()) > bound or int(lags.min()) < 0):
        seen = sorted(set(lags.tolist()))
        raise RuntimeError(f"{what}: trained tokens are {seen} versions stale, outside "
                           f"[0, {bound}]")


def token_staleness_metrics(lags: torch.Tensor, bound: int, prefix: str) -> dict[str, float]:
    """``{prefix}/token_staleness_mean|max`` over the trained tokens and the share of them
    at each lag 0..bound (``{prefix}/token_lag_<k>``)."""
    n = lags.numel()
    out = {f"{prefix}/token_staleness_mean": float(lags.float().mean()) if n else 0.0,
           f"{prefix}/token_staleness_max": float(lags.max()) if n else 0.0}
    for k in range(bound + 1):
        out[f"{prefix}/token_lag_{k}"] = float((lags == k).sum()) / n if n else 0.0
    return out
