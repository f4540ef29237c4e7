"""Split a group call's arguments over workers (scatter) and merge their outputs (gather).

Pure functions over a `RemoteSpec`, the group size and a `DpLayout`; nothing here talks to Ray,
so every mode is testable in one process.

- ``ONE_TO_ALL``: every worker gets the same arguments; outputs come back as a list.
- ``ALL_TO_ALL``: every argument is a list with one item per worker.
- ``DP_SPLIT``: the batch argument (a TensorDict) is padded to a multiple of the dp size
  (copies of its first rows), split into equal contiguous shards, shard ``d`` goes to the workers
  of dp rank ``d``; the collect sources' outputs are concatenated in dp order and the padding
  is trimmed, so the result has exactly the input's rows in the input's order. Other arguments
  are broadcast.
- ``DP_SPLIT_RAW``: the same split; the sources' outputs come back as a list in dp order.
- ``Execute.RANK_ZERO``: only rank 0 runs; its output is returned as is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensordict import TensorDict

from toolrl.batch import batch_len, concat, pad_to_divisor, split, unpad
from toolrl.controller.worker import Dispatch, Execute, MeshCoordinate, RemoteSpec


class DispatchError(ValueError):
    """Arguments or outputs do not match the method's dispatch mode."""


@dataclass(frozen=True)
class DpLayout:
    """Per worker: its data-parallel rank and whether its output is collected."""

    dp_ranks: tuple[int, ...]
    is_collect: tuple[bool, ...]

    @classmethod
    def identity(cls, world_size: int) -> DpLayout:
        """Every worker is its own dp rank and a collect source."""
        return cls(tuple(range(world_size)), (True,) * world_size)

    @classmethod
    def from_coordinates(cls, mesh: str,
                         coords: Sequence[MeshCoordinate | None]) -> DpLayout:
        """Build and validate the layout workers registered for ``mesh``."""
        missing = [rank for rank, c in enumerate(coords) if c is None]
        if missing:
            raise DispatchError(
                f"ranks {missing} did not register mesh {mesh!r}; call "
                f"self.register_mesh({mesh!r}, dp_rank=..., is_collect=...) in the worker "
                f"before calling a method declared with mesh={mesh!r}")
        dp = tuple(c.dp_rank for c in coords if c is not None)
        collect = tuple(c.is_collect for c in coords if c is not None)
        size = max(dp) + 1
        absent = sorted(set(range(size)) - set(dp))
        if absent:
            raise DispatchError(f"mesh {mesh!r}: dp ranks {absent} have no worker "
                                f"(registered dp ranks per worker: {list(dp)})")
        for d in range(size):
            sources = [r for r in range(len(dp)) if dp[r] == d and collect[r]]
            if len(sources) != 1:
                raise DispatchError(
                    f"mesh {mesh!r}: dp rank {d} needs exactly one collect source, found "
                    f"workers {sources} (mark one model-parallel rank per dp rank is_collect)")
        return cls(dp, collect)

    @property
    def world_size(self) -> int:
        return len(self.dp_ranks)

    @property
    def dp_size(self) -> int:
        return max(self.dp_ranks) + 1

    def sources(self) -> list[int]:
        """Collect-source worker indices ordered by dp rank."""
        by_dp = {d: w for w, (d, c) in enumerate(zip(self.dp_ranks, self.is_collect,
                                                     strict=True)) if c}
        return [by_dp[d] for d in range(self.dp_size)]


@dataclass(frozen=True)
class Sharded:
    """A batch that is already split over dp ranks (e.g. the futures of an earlier call).

    ``shards[d]`` goes to the workers of dp rank ``d``; ``pad`` rows at the end are padding.
    """

    shards: tuple[Any, ...]
    pad: int = 0


@dataclass(frozen=True)
class Plan:
    """What each running worker receives, and what `gather` needs to undo the split."""

    ranks: tuple[int, ...]
    calls: tuple[tuple[tuple[Any, ...], dict[str, Any]], ...]
    pad: int = 0
    padded_size: int | None = None


def batch_location(spec: RemoteSpec, args: Sequence[Any],
                   kwargs: Mapping[str, Any]) -> tuple[str, int | str] | None:
    """Where the batch argument of a split call is: ("args", index), ("kwargs", name) or None."""
    if spec.batch_arg is None or spec.signature is None:
        return None
    if spec.batch_arg in kwargs:
        return ("kwargs", spec.batch_arg)
    index = list(spec.signature.parameters).index(spec.batch_arg) - 1
    if index < len(args):
        return ("args", index)
    return None


def scatter(spec: RemoteSpec, args: tuple[Any, ...], kwargs: Mapping[str, Any],
            layout: DpLayout) -> Plan:
    """Turn one group call into per-worker arguments."""
    spec.bind(args, kwargs)
    world_size = layout.world_size
    kwargs = dict(kwargs)
    if spec.execute is Execute.RANK_ZERO:
        return Plan(ranks=(0,), calls=((tuple(args), kwargs),))
    ranks = tuple(range(world_size))
    if spec.dispatch is Dispatch.ONE_TO_ALL:
        return Plan(ranks=ranks, calls=tuple((tuple(args), dict(kwargs)) for _ in ranks))
    if spec.dispatch is Dispatch.ALL_TO_ALL:
        named = [(f"argument {i}", a) for i, a in enumerate(args)]
        named += [(f"argument {k!r}", v) for k, v in kwargs.items()]
        for label, value in named:
            if not isinstance(value, list | tuple) or len(value) != world_size:
                got = (f"a {type(value).__name__} of length {len(value)}"
                       if isinstance(value, list | tuple) else type(value).__name__)
                raise DispatchError(
                    f"{spec.owner}.{spec.name} is ALL_TO_ALL: {label} must be a list with one "
                    f"item per worker ({world_size}), got {got}")
        return Plan(ranks=ranks, calls=tuple(
            (tuple(a[r] for a in args), {k: v[r] for k, v in kwargs.items()}) for r in ranks))
    return _scatter_split(spec, args, kwargs, layout)


def _scatter_split(spec: RemoteSpec, args: tuple[Any, ...], kwargs: dict[str, Any],
                   layout: DpLayout) -> Plan:
    where = batch_location(spec, args, kwargs)
    if where is None:
        raise DispatchError(f"{spec.owner}.{spec.name} splits {spec.batch_arg!r}, but the call "
                            f"did not pass it")
    kind, key = where
    batch = kwargs[key] if kind == "kwargs" else args[key]  # type: ignore[index]
    dp_size = layout.dp_size
    if isinstance(batch, Sharded):
        if len(batch.shards) != dp_size:
            raise DispatchError(f"{spec.owner}.{spec.name}: got {len(batch.shards)} shards for "
                                f"{dp_size} dp ranks")
        shards, pad, padded_size = list(batch.shards), batch.pad, None
    elif isinstance(batch, TensorDict):
        if batch.batch_dims < 1 or batch_len(batch) == 0:
            raise DispatchError(f"{spec.owner}.{spec.name}: cannot split an empty batch "
                                f"(batch_size={list(batch.batch_size)})")
        padded, pad = pad_to_divisor(batch, dp_size)
        shards, padded_size = split(padded, dp_size), batch_len(padded)
    else:
        raise DispatchError(
            f"{spec.owner}.{spec.name} is {spec.dispatch.name}: argument {spec.batch_arg!r} "
            f"must be a TensorDict, got {type(batch).__name__}")
    calls = []
    for rank in range(layout.world_size):
        shard = shards[layout.dp_ranks[rank]]
        if kind == "kwargs":
            calls.append((tuple(args), {**kwargs, key: shard}))
        else:
            a = list(args)
            a[key] = shard  # type: ignore[index]
            calls.append((tuple(a), dict(kwargs)))
    return Plan(ranks=tuple(range(layout.world_size)), calls=tuple(calls), pad=pad,
                padded_size=padded_size)


def gather(spec: RemoteSpec, outputs: Sequence[Any], plan: Plan, layout: DpLayout) -> Any:
    """Merge per-worker outputs (in ``plan.ranks`` order) into the call's result."""
    if spec.execute is Execute.RANK_ZERO:
        return outputs[0]
    if not spec.dispatch.splits:
        return list(outputs)
    parts = [outputs[w] for w in layout.sources()]
    if spec.dispatch is Dispatch.DP_SPLIT_RAW:
        return parts
    if all(p is None for p in parts):
        return None
    bad = [type(p).__name__ for p in parts if not isinstance(p, TensorDict)]
    if bad:
        raise DispatchError(
            f"{spec.owner}.{spec.name} is DP_SPLIT, so each worker must return a TensorDict "
            f"(or None); got {bad}. Use DP_SPLIT_RAW to get per-worker values back as a list")
    out = concat(parts)
    if plan.pad:
        size = batch_len(out)
        if (plan.padded_size is not None and size != plan.padded_size) or size < plan.pad:
            raise DispatchError(
                f"{spec.owner}.{spec.name}: the workers returned {size} rows for a padded "
                f"input of {plan.padded_size}; cannot trim the {plan.pad} padding rows. A "
                f"DP_SPLIT method must return one row per input row")
        out = unpad(out, plan.pad)
    return out


__all__ = ["DispatchError", "DpLayout", "Plan", "Sharded", "batch_location", "gather", "scatter"]
