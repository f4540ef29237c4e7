"""Composition of reward plugins from config: weights, gates, clipping, and the executor that
runs them (async, batched, or in a process pool) without ever failing a batch.

Composing rewards from config (`build_reward`), YAML shown::

    reward:
      rewards:                                   # required: the components, in order
        - {name: bfcl_ast, weight: 1.0}
        - {name: format, weight: 0.2, gate: {reward: bfcl_ast, above: 0.0}}
        - {name: length_penalty, kwargs: {max_tokens: 256}}
      scale: 1.0                                 # total = clip(scale * sum)
      clip: [-1.0, 2.0]                          # or {min: -1.0, max: 2.0}; either may be null
      fallback: 0.0                              # score of a component that raised
      pool_workers: 2                            # processes for components with pool: true
      max_concurrency: 64                        # concurrent calls of one async reward

Component keys: ``name`` (registry id, required), ``alias`` (metric name, default ``name``;
needed to use one reward twice), ``weight`` (default 1.0), ``kwargs`` (passed to the reward),
``gate`` (``{reward: <alias>, above: <float, default 0>}``: the component pays only when the raw
score of that other component is strictly greater than ``above``, the guard against
format-reward hacking; the key is not ``on``, which YAML 1.1 reads as ``true``), ``fallback``
(overrides the top-level one), ``pool`` (run in the process pool; for CPU-heavy, module-level
rewards), ``timeout`` (seconds, for async and pooled calls).

The total of a trajectory is ``clip(scale * sum_i weight_i * open_i * raw_i)``; per-turn lists
(from components that return them) combine the same way, unclipped, shorter ones padded with 0.
A failed component counts as its fallback everywhere, gates included. Every component is
reported as its own metric ``reward/<alias>`` (its raw score; sub-scores of a `RewardResult` as
``reward/<alias>/<key>``), with ``reward/total``, ``reward/errors/<alias>`` (how many samples
raised, were non-finite or timed out) and ``reward/gate_open/<alias>``. A reward that fails is
logged loudly once (name, sample id, traceback), scored with the fallback and counted; it never
fails the batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import itertools
import logging
import math
import multiprocessing
import pickle
import sys
import traceback
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from toolrl.core.errors import describe_exception
from toolrl.core.trajectory import Trajectory
from toolrl.registry import RegistryError
from toolrl.reward.api import RewardError, RewardResult, RewardSpec, Score, get_reward_spec

__all__ = ["BoundReward", "ComponentConfig", "ComposedReward", "Gate", "GateEntry",
           "RewardBatch", "RewardConfig", "RewardConfigError", "RewardEntry", "RewardFailure",
           "RewardSection", "build_reward", "make_reward", "to_result"]

log = logging.getLogger(__name__)


class RewardConfigError(ValueError):
    """A reward config is malformed; the message says which key and what is valid."""


def _check_kwargs(target: Callable[..., Any], kwargs: Mapping[str, Any], name: str,
                  positional: int) -> None:
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*([None] * positional), **kwargs)
    except TypeError as exc:
        params = [p for p in list(sig.parameters.values())[positional:]
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        valid = ", ".join(f"{p.name}" + ("" if p.default is p.empty else f"={p.default!r}")
                          for p in params) or "(none)"
        raise RewardConfigError(
            f"reward {name!r}: bad kwargs {dict(kwargs)!r} ({exc}). Valid kwargs: {valid}"
        ) from None


class BoundReward:
    """A reward with its kwargs bound, behind one async interface for single and batched forms."""

    def __init__(self, spec: RewardSpec, kwargs: Mapping[str, Any] | None = None) -> None:
        self.spec = spec
        self.kwargs = dict(kwargs or {})
        target = spec.target
        self._single: Callable[[Trajectory], Any] | None = None
        self._batch: Callable[[list[Trajectory]], Any] | None = None
        if inspect.isclass(target):
            _check_kwargs(target, self.kwargs, spec.name, positional=0)
            instance = target(**self.kwargs)
            batch = getattr(instance, "batch", None)
            self._batch = batch if callable(batch) else None
            self._single = instance if callable(instance) else None
            if self._single is None and self._batch is None:
                raise RewardConfigError(f"reward class {spec.name!r} defines neither __call__ "
                                        f"nor batch")
        else:
            _check_kwargs(target, self.kwargs, spec.name, positional=1)
            fn = functools.partial(target, **self.kwargs) if self.kwargs else target
            if spec.batched:
                self._batch = fn
            else:
                self._single = fn

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def batched(self) -> bool:
        return self._batch is not None

    async def one(self, traj: Trajectory) -> Score:
        """Score one trajectory (through the batched form when that is the only one)."""
        if self._single is None:
            out = await self.many([traj])
            if isinstance(out[0], BaseException):
                raise out[0]
            return out[0]
        result = self._single(traj)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def many(self, trajs: list[Trajectory]) -> list[Score | BaseException]:
        """Score a batch (a wrong-length answer of a batched reward raises RewardError)."""
        if self._batch is None:
            return list(await asyncio.gather(*(self.one(t) for t in trajs),
                                             return_exceptions=True))
        out = self._batch(trajs)
        if inspect.isawaitable(out):
            out = await out
        out = list(out)
        if len(out) != len(trajs):
            raise RewardError(f"batched reward {self.name!r} returned {len(out)} results "
                              f"for {len(trajs)} trajectories")
        return out


def make_reward(name: str, **kwargs: Any) -> BoundReward:
    """Look ``name`` up (entry points included) and bind ``kwargs`` (validated)."""
    return BoundReward(get_reward_spec(name), kwargs)


def to_result(value: Any) -> RewardResult:
    """Normalize a reward's return value; raises RewardError when it is not a finite score."""
    if isinstance(value, RewardResult):
        result = value
    elif isinstance(value, (int, float)):  # bool included: True -> 1.0
        result = RewardResult(score=float(value))
    else:
        try:  # numpy / torch scalars
            result = RewardResult(score=float(value))
        except (TypeError, ValueError):
            raise RewardError(f"expected a float or RewardResult, got {type(value).__name__}: "
                              f"{value!r}") from None
    if not math.isfinite(result.score):
        raise RewardError(f"non-finite score {result.score!r}")
    return result


# ---------------------------------------------------------------------------------------------
# Composition from config
# ---------------------------------------------------------------------------------------------

_RESERVED = ("total", "errors", "gate_open")


@dataclass
class GateEntry:
    """A component's ``gate``: it pays only when the raw score of another component (``reward``)
    is strictly greater than ``above``. The key is not ``on``, which YAML 1.1 reads as true."""

    reward: str = ""  # the gating component's alias ("": no gate)
    above: float = 0.0  # the gating component's raw score must be > this


@dataclass
class RewardEntry:
    """One component of a reward set (an item of ``rewards:``), as a config writes it."""

    name: str = ""  # a registered reward id (required; `toolrl rewards` lists them)
    # its metric name, reward/<alias> (None: the name); two components of one reward need two
    alias: str | None = None
    weight: float = 1.0  # its weight in the sum
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to the reward
    gate: GateEntry = field(default_factory=GateEntry)  # pay only when another one scores
    fallback: float | None = None  # score of a sample it fails on (None: the set's fallback)
    pool: bool = False  # run in the process pool (CPU-heavy, module-level rewards)
    timeout: float | None = None  # seconds per async or pooled call (None: no bound)


@dataclass
class RewardSection:
    """A reward set as a config writes it (``reward:``, and each entry of ``env_rewards``):
    components with weights and gates; the total is ``clip(scale * sum)``. Its types are the
    schema's; `resolved` holds the rules the types cannot say and gives the `RewardConfig`."""

    rewards: list[RewardEntry] = field(default_factory=list)  # the components, in order
    scale: float = 1.0  # total = clip(scale * sum of weighted components)
    clip: Any = None  # [min, max] or {min: .., max: ..}, either may be null; null: no clip
    fallback: float = 0.0  # score of a component on a sample it failed on
    pool_workers: int = 2  # processes for the components with pool: true
    max_concurrency: int = 64  # concurrent calls of one async reward

    def __post_init__(self) -> None:
        self.resolved()  # a config pass keys its error: reward.rewards[1]: ...

    def resolved(self) -> RewardConfig:
        """The rules of a reward set that its types cannot say (a non-empty list, distinct
        metric names, gates that name another component, finite numbers, a clip's shape and
        order, positive counts and timeouts), and the `RewardConfig` it resolves to (aliases
        filled in). Raises `RewardConfigError` naming the key (``rewards[1].weight``)."""
        if not isinstance(self.rewards, list) or not self.rewards:
            raise RewardConfigError("rewards: a reward set needs a non-empty list of "
                                    f"components with keys {', '.join(_COMPONENT_KEYS)}")
        comps = tuple(_component(i, item) for i, item in enumerate(self.rewards))
        aliases = [c.alias for c in comps]
        for i, alias in enumerate(aliases):
            if alias in aliases[:i]:
                raise RewardConfigError(
                    f"rewards[{i}]: duplicate metric name {alias!r}; give the second one "
                    f"another 'alias'")
        for i, c in enumerate(comps):
            if c.gate is not None and (c.gate.reward not in aliases
                                       or c.gate.reward == c.alias):
                others = ", ".join(a for a in aliases if a != c.alias) or "(none)"
                raise RewardConfigError(f"rewards[{i}].gate.reward={c.gate.reward!r} ({c.alias})"
                                        f" must name another component; components: {others}")
        return RewardConfig(
            components=comps, scale=_num(self.scale, "scale"), clip=_clip(self.clip),
            fallback=_num(self.fallback, "fallback"),
            pool_workers=_int(self.pool_workers, "pool_workers", minimum=1),
            max_concurrency=_int(self.max_concurrency, "max_concurrency", minimum=1))


_TOP_KEYS = tuple(f.name for f in fields(RewardSection))
_COMPONENT_KEYS = tuple(f.name for f in fields(RewardEntry))
_GATE_KEYS = tuple(f.name for f in fields(GateEntry))


@dataclass(frozen=True)
class Gate:
    """Pay a component only when the raw score of component ``reward`` is > ``above``."""

    reward: str
    above: float = 0.0


@dataclass(frozen=True)
class ComponentConfig:
    """One component of a resolved reward set."""

    name: str
    alias: str
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)
    gate: Gate | None = None
    fallback: float | None = None
    pool: bool = False
    timeout: float | None = None


@dataclass(frozen=True)
class RewardConfig:
    """A resolved reward set: what `ComposedReward` runs (see the module docstring)."""

    components: tuple[ComponentConfig, ...]
    scale: float = 1.0
    clip: tuple[float | None, float | None] | None = None
    fallback: float = 0.0
    pool_workers: int = 2
    max_concurrency: int = 64

    @classmethod
    def from_config(cls, cfg: Any) -> RewardConfig:
        """A `RewardSection`, or a dict / OmegaConf node / list of components (a component may
        be just its name) typed by the same schema; errors name the key and the valid ones."""
        if isinstance(cfg, RewardConfig):
            return cfg
        return as_section(cfg).resolved()


def as_section(cfg: Any) -> RewardSection:
    """A `RewardSection` from itself, or from a dict / OmegaConf node / list of components (a
    component may be just its name), typed by the schema (`typed_section`)."""
    if isinstance(cfg, RewardSection):
        return cfg
    cfg = _plain(cfg)
    if isinstance(cfg, list):
        cfg = {"rewards": cfg}
    if not isinstance(cfg, Mapping):
        raise RewardConfigError(f"reward config must be a mapping or a list, got {cfg!r}")
    items = cfg.get("rewards")
    if isinstance(items, list):
        items = [{"name": c} if isinstance(c, str) else c for c in items]
        for i, item in enumerate(items):
            gate = item.get("gate") if isinstance(item, Mapping) else None
            if isinstance(gate, Mapping) and True in gate:
                raise RewardConfigError(f"rewards[{i}].gate: YAML read the key 'on' as "
                                        f"true; name the gating component with 'reward:'")
        cfg = {**cfg, "rewards": items}
    return typed_section(cfg)


def typed_section(data: Mapping[str, Any]) -> RewardSection:
    """``data`` typed by the `RewardSection` schema, as a config's ``reward:`` is: an unknown
    key or a value of the wrong type is a `RewardConfigError` naming the key."""
    # lazy: omegaconf (~100 ms) only where a reward set is written as plain data
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

    try:
        section = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RewardSection),
                                                      dict(data)))
    except ConfigKeyError as exc:
        owner = getattr(exc, "object_type", None)
        valid = [f.name for f in fields(owner)] if is_dataclass(owner) else list(_TOP_KEYS)
        parent = _where(data, owner, exc.key).rpartition(".")[0]
        where = f"{parent}: " if parent else ""
        raise RewardConfigError(f"{where}unknown key(s) {exc.key!r}; valid keys: "
                                f"{', '.join(valid)}") from None
    except ValidationError as exc:
        key = _where(data, getattr(exc, "object_type", None), exc.key)
        raise RewardConfigError(f"{key} must be {_kind(exc)}, got "
                                f"{getattr(exc, 'value', None)!r}") from None
    except OmegaConfBaseException as exc:
        raise RewardConfigError(f"reward config: {str(exc).splitlines()[0]}") from None
    assert isinstance(section, RewardSection)
    return section


def _where(data: Mapping[str, Any], owner: Any, key: Any) -> str:
    """The key path of ``key`` of a section of type ``owner`` in ``data`` (OmegaConf's error
    inside a list item names only the last key)."""
    items = data.get("rewards")
    items = items if isinstance(items, list) else []
    for i, item in enumerate(items):
        gate = item.get("gate") if isinstance(item, Mapping) else None
        if owner is RewardEntry and isinstance(item, Mapping) and key in item:
            return f"rewards[{i}].{key}"
        if owner is GateEntry and isinstance(gate, Mapping) and key in gate:
            return f"rewards[{i}].gate.{key}"
    return str(key)


def _kind(exc: Any) -> str:
    """What the schema wants at the key of a typing error."""
    owner, key = getattr(exc, "object_type", None), getattr(exc, "key", None)
    hint = typing.get_type_hints(owner).get(str(key)) if is_dataclass(owner) else None
    args = set(typing.get_args(hint)) | {hint}
    return "a finite number" if float in args else "an integer" if int in args else \
        "true or false" if bool in args else "a string" if str in args else \
        "a mapping" if typing.get_origin(hint) is dict or dict in args else f"a {hint}"


def _plain(cfg: Any) -> Any:
    # An OmegaConf container exists only once omegaconf is imported (the trainer's config
    # does): told apart without importing omegaconf (~100 ms) into every reward plugin.
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and isinstance(cfg, (omegaconf.DictConfig, omegaconf.ListConfig)):
        return omegaconf.OmegaConf.to_container(cfg, resolve=True)
    return cfg


def _num(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RewardConfigError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def _int(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RewardConfigError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value


def _clip(value: Any) -> tuple[float | None, float | None] | None:
    value = _plain(value)
    if value is None:
        return None
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in ("min", "max")]
        if unknown:
            raise RewardConfigError(f"clip: unknown key(s) {', '.join(map(repr, unknown))}; "
                                    f"valid keys: min, max")
        lo, hi = value.get("min"), value.get("max")
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        lo, hi = value
    else:
        raise RewardConfigError(f"clip must be [min, max] or {{min, max}}, got {value!r}")
    lo = None if lo is None else _num(lo, "clip.min")
    hi = None if hi is None else _num(hi, "clip.max")
    if lo is not None and hi is not None and lo > hi:
        raise RewardConfigError(f"clip: min {lo} > max {hi}")
    return lo, hi


def _component(i: int, item: RewardEntry) -> ComponentConfig:
    where = f"rewards[{i}]"
    if not item.name:
        raise RewardConfigError(f"{where}.name: a registered reward id is required")
    alias = item.name if item.alias is None else item.alias
    if not alias or "/" in alias or alias in _RESERVED:
        raise RewardConfigError(f"{where}.alias={alias!r} must be a non-empty name without '/' "
                                f"and not one of {', '.join(_RESERVED)}")
    gate = None
    if item.gate.reward:
        gate = Gate(reward=item.gate.reward, above=_num(item.gate.above, f"{where}.gate.above"))
    elif item.gate.above != 0.0:
        raise RewardConfigError(f"{where}.gate.reward: gate.above={item.gate.above} needs the "
                                f"gating component's alias in gate.reward")
    if item.timeout is not None and _num(item.timeout, f"{where}.timeout") <= 0:
        raise RewardConfigError(f"{where}.timeout must be > 0, got {item.timeout!r}")
    return ComponentConfig(
        name=item.name, alias=alias, weight=_num(item.weight, f"{where}.weight"),
        kwargs=dict(_plain(item.kwargs) or {}), gate=gate,
        fallback=None if item.fallback is None else _num(item.fallback, f"{where}.fallback"),
        pool=item.pool, timeout=None if item.timeout is None else float(item.timeout))


@dataclass(frozen=True)
class RewardFailure:
    """One sample a reward failed on."""

    reward: str  # the component's alias
    index: int
    sample_id: Any
    message: str


@dataclass
class RewardBatch:
    """Scores of a batch: totals, raw component scores, per-turn lists, errors, reasons."""

    scores: list[float]
    components: dict[str, list[float | None]]  # alias (and alias/sub) -> per-sample raw score
    per_turn: list[list[float] | None]
    errors: dict[str, int]
    failures: list[RewardFailure]
    reasons: dict[str, list[str]]  # alias -> per-sample reason ("" when none)
    gate_open: dict[str, list[bool]]  # gated alias -> per-sample gate state

    def metrics(self) -> dict[str, float]:
        """``reward/total``, ``reward/<alias>[/<sub>]`` means, ``reward/errors/<alias>`` counts."""
        out: dict[str, float] = {"reward/total": _mean(self.scores)}
        for key, values in self.components.items():
            out[f"reward/{key}"] = _mean([v for v in values if v is not None])
        for key, count in self.errors.items():
            out[f"reward/errors/{key}"] = float(count)
        for key, opened in self.gate_open.items():
            out[f"reward/gate_open/{key}"] = _mean([float(o) for o in opened])
        return out

    def results(self) -> list[RewardResult]:
        """One RewardResult per trajectory (total score, raw components, per-turn)."""
        out = []
        for i, score in enumerate(self.scores):
            comps = {k: v[i] for k, v in self.components.items() if v[i] is not None}
            reason = "; ".join(f"{k}: {r[i]}" for k, r in self.reasons.items() if r[i])
            out.append(RewardResult(score=score, components=comps, per_turn=self.per_turn[i],
                                    reason=reason))
        return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


class ComposedReward:
    """Weighted, gated, clipped and scaled sum of reward components (see the module docstring).

    ``await ascore(trajs)`` is primary; ``score(trajs)`` is a sync shim. Use as a context manager
    (or call `close`) when a component runs in the process pool.
    """

    def __init__(self, config: RewardConfig) -> None:
        self.config = config
        self.rewards: dict[str, BoundReward] = {}
        for c in config.components:
            try:
                bound = make_reward(c.name, **c.kwargs)
            except (RegistryError, RewardConfigError) as exc:
                raise RewardConfigError(f"rewards ({c.alias}): {exc}") from None
            except (TypeError, ValueError) as exc:  # the reward rejected its kwargs
                raise RewardConfigError(f"rewards ({c.alias}): reward {c.name!r} rejected "
                                        f"kwargs {c.kwargs!r}: {exc}") from exc
            if c.pool:
                try:
                    pickle.dumps((bound.spec.target, bound.kwargs))
                except Exception as exc:
                    raise RewardConfigError(
                        f"rewards ({c.alias}): pool: true needs a module-level reward with "
                        f"picklable kwargs ({type(exc).__name__}: {exc})") from None
            self.rewards[c.alias] = bound
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._logged: set[str] = set()

    # -- lifecycle --
    def close(self) -> None:
        """Shut the process pool down (if one was started)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> ComposedReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            # spawn: never fork a process that holds Ray / vLLM threads.
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.config.pool_workers,
                mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    # -- scoring --
    def score(self, trajs: Sequence[Trajectory | Mapping[str, Any]]) -> RewardBatch:
        """Sync shim over `ascore` (runs a private event loop, in a thread if one is running)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.ascore(trajs))
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            return ex.submit(asyncio.run, self.ascore(trajs)).result()

    async def __call__(self, traj: Trajectory | Mapping[str, Any]) -> RewardResult:
        """The composition is itself a RewardFn: the total of one trajectory."""
        return (await self.ascore([traj])).results()[0]

    async def ascore(self, trajs: Sequence[Trajectory | Mapping[str, Any]]) -> RewardBatch:
        """Score every trajectory with every component; never raises for a failing reward."""
        trajs = [Trajectory.from_dict(t) for t in trajs]
        outcomes = await asyncio.gather(*(self._run_component(c, trajs)
                                          for c in self.config.components))
        return self._combine(trajs, dict(zip([c.alias for c in self.config.components],
                                             outcomes, strict=True)))

    async def _run_component(self, c: ComponentConfig,
                             trajs: list[Trajectory]) -> list[RewardResult | BaseException]:
        bound = self.rewards[c.alias]
        try:
            if c.pool:
                raw = await self._run_pooled(c, bound, trajs)
            elif bound.batched:
                raw = await self._timed(bound.many(trajs), c.timeout)
            else:
                sem = asyncio.Semaphore(self.config.max_concurrency)

                async def one(t: Trajectory) -> Any:
                    async with sem:
                        try:
                            return await self._timed(bound.one(t), c.timeout)
                        except Exception as exc:
                            return exc

                raw = await asyncio.gather(*(one(t) for t in trajs))
        except Exception as exc:  # the whole batched call failed: every sample gets the error
            raw = [exc] * len(trajs)
        out: list[RewardResult | BaseException] = []
        for value in raw:
            if isinstance(value, BaseException):
                out.append(value)
                continue
            try:
                out.append(to_result(value))
            except RewardError as exc:
                out.append(exc)
        return out

    @staticmethod
    async def _timed(aw: Awaitable[Any], timeout: float | None) -> Any:
        if timeout is None:
            return await aw
        try:
            return await asyncio.wait_for(aw, timeout)
        except TimeoutError:
            raise RewardError(f"timed out after {timeout:g} s") from None

    async def _run_pooled(self, c: ComponentConfig, bound: BoundReward,
                          trajs: list[Trajectory]) -> list[Any]:
        n = min(self.config.pool_workers, max(1, len(trajs)))
        bounds = [len(trajs) * k // n for k in range(n + 1)]
        chunks = [[t.to_dict() for t in trajs[a:b]] for a, b in itertools.pairwise(bounds)
                  if b > a]
        loop = asyncio.get_running_loop()
        try:
            pool = self._executor()
            futures = [loop.run_in_executor(pool, _pool_score, bound.spec.target, bound.kwargs,
                                            bound.spec.batched, chunk) for chunk in chunks]
        except Exception as exc:  # broken pool: start a fresh one next time
            self._pool = None
            return [exc] * len(trajs)
        out: list[Any] = []
        for fut, chunk in zip(futures, chunks, strict=True):
            try:
                out.extend(await self._timed(fut, c.timeout))
            except Exception as exc:
                if isinstance(exc, concurrent.futures.process.BrokenProcessPool):
                    self._pool = None
                out.extend([exc] * len(chunk))
        return out

    def _fail(self, c: ComponentConfig, i: int, traj: Trajectory, exc: BaseException,
              failures: list[RewardFailure]) -> float:
        fallback = self.config.fallback if c.fallback is None else c.fallback
        message = describe_exception(exc)  # type, first line, where it was raised
        sample_id = traj.id if traj.id is not None else i
        failures.append(RewardFailure(reward=c.alias, index=i, sample_id=sample_id,
                                      message=message))
        if c.alias not in self._logged:
            self._logged.add(c.alias)
            tb = "".join(traceback.format_exception(exc)) if exc.__traceback__ else message
            log.error("reward %r (%s) failed on sample %r: %s -- scored with fallback %s; "
                      "further failures are counted in reward/errors/%s\n%s",
                      c.alias, c.name, sample_id, message, fallback, c.alias, tb)
        return fallback

    def _combine(self, trajs: list[Trajectory],
                 outcomes: dict[str, list[RewardResult | BaseException]]) -> RewardBatch:
        cfg = self.config
        failures: list[RewardFailure] = []
        components: dict[str, list[float | None]] = {}
        reasons: dict[str, list[str]] = {}
        per_turn_parts: dict[str, list[list[float] | None]] = {}
        errors: dict[str, int] = {}
        for c in cfg.components:
            raw: list[float | None] = []
            reasons[c.alias] = []
            per_turn_parts[c.alias] = []
            errors[c.alias] = 0
            for i, (traj, res) in enumerate(zip(trajs, outcomes[c.alias], strict=True)):
                if isinstance(res, BaseException):
                    raw.append(self._fail(c, i, traj, res, failures))
                    errors[c.alias] += 1
                    reasons[c.alias].append(f"error: {type(res).__name__}: {res}")
                    per_turn_parts[c.alias].append(None)
                    continue
                raw.append(res.score)
                reasons[c.alias].append(res.reason)
                per_turn_parts[c.alias].append(res.per_turn)
                for sub, value in res.components.items():
                    components.setdefault(f"{c.alias}/{sub}", [None] * len(trajs))[i] = value
            components[c.alias] = raw
        gate_open = {c.alias: [components[c.gate.reward][i] > c.gate.above
                               for i in range(len(trajs))]
                     for c in cfg.components if c.gate is not None}
        scores: list[float] = []
        per_turn: list[list[float] | None] = []
        for i in range(len(trajs)):
            total = 0.0
            turns: list[float] | None = None
            for c in cfg.components:
                open_ = gate_open[c.alias][i] if c.alias in gate_open else True
                if not open_:
                    continue
                total += c.weight * components[c.alias][i]
                part = per_turn_parts[c.alias][i]
                if part is not None:
                    turns = (turns or []) + [0.0] * max(0, len(part) - len(turns or []))
                    for t, value in enumerate(part):
                        turns[t] += cfg.scale * c.weight * value
            total *= cfg.scale
            if cfg.clip is not None:
                lo, hi = cfg.clip
                total = total if lo is None else max(lo, total)
                total = total if hi is None else min(hi, total)
            scores.append(total)
            per_turn.append(turns)
        return RewardBatch(scores=scores, components=components, per_turn=per_turn,
                           errors=errors, failures=failures, reasons=reasons,
                           gate_open=gate_open)


def build_reward(cfg: Any) -> ComposedReward:
    """A `ComposedReward` from a `RewardSection`, a config dict, OmegaConf node, list of
    components or a `RewardConfig`."""
    return ComposedReward(RewardConfig.from_config(cfg))


# ---------------------------------------------------------------------------------------------
# Process-pool side
# ---------------------------------------------------------------------------------------------
_POOL_CACHE: dict[tuple[Any, str], BoundReward] = {}


def _pool_score(target: Callable[..., Any], kwargs: dict[str, Any], batched: bool,
                chunk: list[dict[str, Any]]) -> list[Any]:
    """Runs in a pool process: score a chunk; exceptions come back as RewardError values."""
    key = (target, repr(sorted(kwargs.items())))
    bound = _POOL_CACHE.get(key)
    if bound is None:
        name = getattr(target, "__qualname__", repr(target))
        bound = _POOL_CACHE[key] = BoundReward(RewardSpec(name, target, batched), kwargs)
    trajs = [Trajectory.from_dict(d) for d in chunk]

    async def run() -> list[Any]:
        try:
            return await bound.many(trajs)
        except Exception as exc:
            return [exc] * len(trajs)

    results = asyncio.run(run())
    return [_portable(r) for r in results]


def _portable(value: Any) -> Any:
    if isinstance(value, BaseException):
        tb = "".join(traceback.format_exception(value))
        return RewardError(f"{type(value).__name__}: {value} (in pool process)\n{tb}")
    return value
