"""Mini- and micro-batch planning for the FSDP workers.

A worker's local batch is cut into PPO mini-batches (one optimizer step each) and every
mini-batch into micro-batches (one forward/backward each, gradients accumulated). Micro-batches
are either a fixed number of samples or packed by a token budget (dynamic batching): the number
of micro-batches is what first-fit-decreasing packing by real token count needs, agreed across
data-parallel ranks (FSDP2 runs collectives in every forward, so every rank must run the same
number), and the samples are then spread over that many micro-batches balancing tokens
(longest first, each to the lightest micro-batch).
"""

from __future__ import annotations

import heapq

import torch
import torch.distributed as dist
from tensordict import TensorDict

from toolrl.batch import ATTENTION_MASK, RESPONSES, batch_len, select_rows
from toolrl.workers.fsdp import all_reduce


def sequence_lengths(td: TensorDict) -> list[int]:
    """Real (attended) tokens per sample."""
    return [int(n) for n in td.get(ATTENTION_MASK).sum(-1).tolist()]


def mini_batch_slices(n: int, size: int) -> list[slice]:
    """Contiguous slices of at most ``size`` rows covering ``range(n)``."""
    if size < 1:
        raise ValueError(f"mini-batch size must be >= 1, got {size}")
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def fixed_partitions(n: int, size: int) -> list[list[int]]:
    """Consecutive groups of ``size`` indices (the last may be smaller)."""
    return [list(range(s.start, s.stop)) for s in mini_batch_slices(n, size)]


def count_bins(lengths: list[int], max_tokens: int) -> int:
    """How many bins of ``max_tokens`` first-fit-decreasing packing needs (a sample longer
    than the budget gets a bin of its own)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1, got {max_tokens}")
    free: list[int] = []
    for length in sorted(lengths, reverse=True):
        for i, room in enumerate(free):
            if length <= room:
                free[i] -= length
                break
        else:
            free.append(max(max_tokens - length, 0))
    return len(free)


def balanced_partitions(lengths: list[int], k: int) -> list[list[int]]:
    """Spread indices over ``k`` non-empty groups balancing the sum of lengths.

    Longest first, each to the currently lightest group; indices inside a group ascend and
    groups are ordered by their first index, so the plan is deterministic.
    """
    n = len(lengths)
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} samples into {k} non-empty micro-batches")
    heap = [(0, g) for g in range(k)]
    groups: list[list[int]] = [[] for _ in range(k)]
    for i in sorted(range(n), key=lambda i: (-lengths[i], i)):
        load, g = heapq.heappop(heap)
        groups[g].append(i)
        heapq.heappush(heap, (load + lengths[i], g))
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


def unit_lengths(td: TensorDict, units: torch.Tensor) -> list[int]:
    """Tokens each unit of rows runs when the rows of a unit share one prompt: the prompt once
    plus every row's response."""
    attn = td.get(ATTENTION_MASK)
    width = td.get(RESPONSES).shape[1]
    prompt = attn[:, :attn.shape[1] - width].sum(-1)
    response = attn[:, attn.shape[1] - width:].sum(-1)
    n_units = int(units.max()) + 1
    total = torch.zeros(n_units, dtype=torch.long).index_add_(0, units, response)
    first_prompt = torch.zeros(n_units, dtype=torch.long).scatter_(0, units, prompt)
    return (total + first_prompt).tolist()


def plan_micro_batches(td: TensorDict, micro_batch_size: int | None = None,
                       max_tokens: int | None = None, sync: bool = True,
                       units: torch.Tensor | None = None) -> list[list[int]]:
    """Row indices of each micro-batch of ``td``.

    With ``max_tokens`` the plan packs by real token count; the number of micro-batches is the
    maximum over data-parallel ranks when ``sync`` (all ranks must call this together then).
    ``units`` (``[b]`` ids) keeps rows of one unit in one micro-batch, counted as one shared
    prompt plus their responses (`unit_lengths`). Otherwise groups of ``micro_batch_size``
    rows (all of ``td`` when None).
    """
    n = batch_len(td)
    if n == 0:
        raise ValueError("cannot plan micro-batches of an empty batch")
    if max_tokens is None:
        return fixed_partitions(n, micro_batch_size or n)
    lengths = sequence_lengths(td) if units is None else unit_lengths(td, units)
    k, smallest = count_bins(lengths, max_tokens), len(lengths)
    if sync:  # the largest k and the smallest local batch over ranks (one MAX all-reduce)
        k, neg_n = all_reduce(torch.tensor([k, -len(lengths)]), dist.ReduceOp.MAX).tolist()
        smallest = -neg_n
    if k > smallest:
        raise ValueError(f"a rank needs {k} micro-batches but another has only {smallest} "
                         f"samples (or prompt groups): give every data-parallel rank the same "
                         f"number of samples")
    plan = balanced_partitions(lengths, k)
    if units is None:
        return plan
    members: list[list[int]] = [[] for _ in lengths]
    for row, unit in enumerate(units.tolist()):
        members[unit].append(row)
    return [sorted(r for u in part for r in members[u]) for part in plan]


def take(td: TensorDict, index: list[int]) -> TensorDict:
    """Rows ``index`` of ``td`` (a contiguous range is taken as a slice view)."""
    if index == list(range(index[0], index[-1] + 1)):
        return select_rows(td, slice(index[0], index[-1] + 1))
    return select_rows(td, index)


__all__ = [
    "balanced_partitions",
    "count_bins",
    "fixed_partitions",
    "mini_batch_slices",
    "plan_micro_batches",
    "sequence_lengths",
    "take",
    "unit_lengths",
]
