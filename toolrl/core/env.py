"""ToolEnv: a Gymnasium environment whose action is an assistant message.

One episode is one conversation. ``reset(seed=..., options=row)`` starts it from a task row and
returns the initial messages; each ``await env.astep(action_text)`` parses the tool calls in the
assistant's message (with the env's tool-call format), validates their arguments against the
tools' JSON schemas, runs the valid ones concurrently (``asyncio.gather``, results in call
order), and returns the new messages: one ``{"role": "tool", "name", "content"}`` per call (a
typed error observation when the call was bad), and/or the next ``user`` turn. ``step()`` is a
sync shim over ``astep()`` for plain Gymnasium users and ``check_env``.

Reaching ``astep`` through wrappers: ``gymnasium.make`` wraps every env in ``OrderEnforcing``
and ``PassiveEnvChecker``, which have no ``astep``. `toolrl.make_env` therefore returns the env
inside a `toolrl.core.wrappers.ToolWrapper`, whose ``astep`` skips those plain wrappers; with
``gymnasium.make`` directly, call ``env.unwrapped.astep`` or `resolve_astep(env)`.

An env may call a model of its own during an episode (a simulated user, a judge): inside a
rollout, `ToolEnv.rollout_model` is the rollout's own engine as a `ChatModel` (set by the episode
runner before ``reset``); what it writes reaches the policy only as the env's messages, which
never train (mask 0).

Subclass hooks: ``@tool`` methods (collected in definition order), `make_tasks` (task rows from a
seed), `setup` (per-episode state), `on_turn` (what happens after a turn), `evaluate`
(success), `state_snapshot`, `oracle_action` (a scripted policy). Every piece of episode state
lives on the instance, so concurrent episodes (one env instance each) share nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import dataclasses
import inspect
import random
import string
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from toolrl.core.errors import describe_exception
from toolrl.core.parse import ToolCallFormat, get_format
from toolrl.core.tools import (
    Tool,
    ToolResult,
    error_observation,
    make_error,
    parse_error_records,
)
from toolrl.core.trajectory import Trajectory, TurnRecord, plain
from toolrl.core.types import ParseResult, ToolCall

__all__ = [
    "ChatModel",
    "MessagesSpace",
    "OracleUnavailable",
    "SubmitAnswer",
    "ToolEnv",
    "Turn",
    "oracle_policy",
    "resolve_astep",
    "run_episode",
    "submit_tool",
    "tasks_by_kind",
]

PRINTABLE = string.printable
Message = dict[str, Any]
T = TypeVar("T")


class OracleUnavailable(LookupError):
    """The env (or this task row) has no scripted policy."""


@runtime_checkable
class ChatModel(Protocol):
    """A chat model an env may call during an episode (`ToolEnv.rollout_model`).

    ``messages`` are chat messages as the env's own (``role``, ``content``; a tool message's
    ``name``), ``tools`` OpenAI tool schemas; the reply is the model's text, tool calls
    included as the model writes them (parse them with the env's format). ``temperature`` and
    ``max_tokens`` default to the model's own (the rollout's). `chat` blocks: an env calls it
    from a step that runs on a thread of its own (``blocking_step = True``); `achat` is for
    async code.
    """

    def chat(self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *,
             temperature: float | None = None, max_tokens: int | None = None) -> str: ...

    async def achat(self, messages: list[Message], tools: list[dict[str, Any]] | None = None,
                    *, temperature: float | None = None, max_tokens: int | None = None
                    ) -> str: ...


class MessagesSpace(spaces.Space[list]):
    """Chat messages: a list of dicts with a ``role`` and a string ``content``.

    Other keys (``name``, ``tool_call_id``, ``tool_calls``) are allowed. Sampling yields short
    random printable messages.
    """

    def __init__(self, roles: tuple[str, ...] = ("system", "user", "assistant", "tool"),
                 max_messages: int = 256, max_length: int = 1 << 20,
                 seed: int | np.random.Generator | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.roles = tuple(roles)
        self.max_messages = max_messages
        self.max_length = max_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        rng = self.np_random
        chars = np.array(list(PRINTABLE))
        out = []
        for _ in range(int(rng.integers(0, 4))):
            content = "".join(rng.choice(chars, size=int(rng.integers(0, 33))))
            out.append({"role": str(rng.choice(self.roles)), "content": content})
        return out

    def contains(self, x: Any) -> bool:
        return (isinstance(x, list) and len(x) <= self.max_messages
                and all(isinstance(m, dict) and m.get("role") in self.roles
                        and isinstance(m.get("content"), str)
                        and len(m["content"]) <= self.max_length for m in x))

    def __repr__(self) -> str:
        return f"MessagesSpace(roles={self.roles}, max_messages={self.max_messages})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, MessagesSpace) and other.roles == self.roles
                and other.max_messages == self.max_messages
                and other.max_length == self.max_length)


@dataclass
class Turn:
    """An env's decision after one assistant turn (returned by `ToolEnv.on_turn`).

    Attributes:
        messages: extra messages after the tool results (e.g. the scripted user's next line).
        terminated: the episode reached its end (final answer, submit, conversation over).
        reward: the per-turn reward, or None when the env defines none.
    """

    messages: list[Message] = field(default_factory=list)
    terminated: bool = False
    reward: float | None = None


class ToolEnv(gym.Env[list, str]):
    """Base class of tool-calling environments (a `gymnasium.Env`).

    Task rows (``reset(options=row)``) are plain JSON-able dicts:

    - ``id`` (str): a stable task id.
    - ``messages`` (list of chat messages): the initial conversation; or ``question`` (str),
      turned into ``[system (the env's prompt, if any), user question]``.
    - ``ground_truth``: what success means for this env (an answer, BFCL possible answers, ...).
    - ``category`` (str, optional): for per-category metrics.
    - ``expected_state`` (dict, optional): the final `state_snapshot` a stateful env must reach.
    - any env-specific fields (``tools`` for FunctionCalling, ``db`` for Bank, ...).

    ``reset()`` without a row draws one from the env's own generator (`make_tasks`) using the
    seeded ``np_random``, so ``reset(seed=s)`` alone is deterministic.

    ``reset`` returns ``(messages, info)`` with ``info["tools"]`` (OpenAI tool schemas) and
    ``info["format"]`` (the tool-call format name). ``astep`` returns ``(new_messages, reward,
    terminated, truncated, info)`` where info carries ``calls`` (list of `ToolCall`), ``parse``
    (`ParseResult`), ``errors`` (typed error dicts: ``type``, ``tool``, ``message``),
    ``latencies`` (seconds per call, in call order), ``turn``, ``turn_reward`` when the env
    defines one, and, when the episode ends, ``success`` and ``end_reason``. The reward is the
    turn reward (0 when undefined) plus, at the end, `outcome_reward`.

    Args:
        tool_format: tool-call format name (default: the class's ``tool_format``).
        max_turns: assistant turns before truncation.
        tool_timeout: default per-call timeout in seconds (a tool's own limit can be lower).
        max_output_chars: default cap on one tool output.
        max_calls_per_turn: calls run per turn (default the class's
            ``default_max_calls_per_turn``, 32; None there: no cap); the rest of a longer turn
            are not run: one ``too_many_calls`` error observation says so and its record
            counts them (``dropped``; `TurnRecord.dropped_calls`, the rollout's
            ``rollout/dropped_calls_mean``). A turn costs bounded time and observation size.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    tool_format: ClassVar[str] = "hermes"
    system_prompt: ClassVar[str | None] = None
    default_max_turns: ClassVar[int] = 8
    default_tool_timeout: ClassVar[float] = 30.0
    default_max_output_chars: ClassVar[int] = 2000
    max_action_chars: ClassVar[int] = 16384
    max_parse_errors_shown: ClassVar[int] = 3
    # True when a step runs blocking code (sync evaluate/on_turn, inline tools): the rollout
    # then steps the env on a daemon thread, where rollout.env_timeout_s can stop the wait
    blocking_step: ClassVar[bool] = False
    default_max_calls_per_turn: ClassVar[int | None] = 32  # None: every call runs
    # the rollout's own engine as a chat model, set by the episode runner before reset (None
    # outside a rollout: run_episode, check-env, the warm start's oracle)
    rollout_model: ChatModel | None = None
    _tool_attrs: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        names: list[str] = []
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                if isinstance(value, Tool):
                    if attr not in names:
                        names.append(attr)
                elif attr in names:  # overridden by something that is not a tool
                    names.remove(attr)
        cls._tool_attrs = tuple(names)

    def __init__(self, *, tool_format: str | None = None, max_turns: int | None = None,
                 tool_timeout: float | None = None, max_output_chars: int | None = None,
                 max_calls_per_turn: int | None = None,
                 render_mode: str | None = None) -> None:
        self.format_name = tool_format or type(self).tool_format
        self.parser: ToolCallFormat = get_format(self.format_name)
        self.max_turns = max_turns if max_turns is not None else self.default_max_turns
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        self.tool_timeout = tool_timeout if tool_timeout is not None else \
            self.default_tool_timeout
        self.max_output_chars = max_output_chars if max_output_chars is not None else \
            self.default_max_output_chars
        self.max_calls_per_turn = max_calls_per_turn if max_calls_per_turn is not None else \
            self.default_max_calls_per_turn
        if self.max_calls_per_turn is not None and self.max_calls_per_turn < 1:
            raise ValueError(f"max_calls_per_turn must be >= 1, got {self.max_calls_per_turn}")
        self.render_mode = render_mode
        self.action_space = spaces.Text(max_length=self.max_action_chars, min_length=0,
                                        charset=PRINTABLE)
        self.observation_space = MessagesSpace()
        self.row: dict[str, Any] | None = None
        self.messages: list[Message] = []
        self.turn = 0
        self.done = True
        self.success: bool | None = None
        self._tools: dict[str, Tool] = {}
        self._sync_loop: asyncio.AbstractEventLoop | None = None

    # --- hooks for subclasses ----------------------------------------------------------------
    @classmethod
    def make_tasks(cls, n: int, seed: int = 0, split: str = "train",
                   **kwargs: Any) -> list[dict[str, Any]]:
        """``n`` task rows generated deterministically from ``seed`` (and ``split``)."""
        raise TypeError(f"{cls.__name__} has no task generator; pass a task row with "
                        f"reset(options=row)")

    def sample_task(self) -> dict[str, Any]:
        """One task row drawn with the seeded ``np_random`` (used by a bare ``reset()``)."""
        return self.make_tasks(1, seed=int(self.np_random.integers(2**31 - 1)))[0]

    def setup(self, row: dict[str, Any]) -> None:
        """Build this episode's state from the row (called by ``reset``)."""

    def initial_messages(self, row: dict[str, Any]) -> list[Message]:
        """The conversation the model starts from."""
        if "messages" in row:
            messages = copy.deepcopy(list(row["messages"]))
        elif "question" in row:
            messages = [{"role": "user", "content": str(row["question"])}]
        else:
            raise ValueError(f"{type(self).__name__}: a task row needs 'messages' or "
                             f"'question'; got keys {sorted(row)}")
        if self.system_prompt and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def episode_tools(self) -> list[Tool]:
        """This episode's tools; default: the class's ``@tool`` methods bound to ``self``."""
        cls = type(self)  # bound from the class: an instance attribute of the same name is fine
        return [getattr(cls, attr).__get__(self, cls) for attr in self._tool_attrs]

    def on_turn(self, parse: ParseResult, results: list[ToolResult]) -> Turn:
        """Decide what follows a turn. Default: a message without any call is the final answer."""
        return Turn(terminated=not parse.calls and not parse.errors)

    def evaluate(self) -> bool:
        """Whether the episode reached its goal (called once, when it ends)."""
        return False

    async def aevaluate(self) -> bool:
        """Async `evaluate` for envs that must ask a service; default: `evaluate`."""
        return self.evaluate()

    def outcome_reward(self, success: bool) -> float:
        """The reward added at the end of the episode."""
        return float(success)

    def state_snapshot(self) -> dict[str, Any]:
        """JSON-serializable state of the episode's world (``{}`` when stateless)."""
        return {}

    @classmethod
    def eval_metrics(cls, trajectories: Sequence[Trajectory]) -> dict[str, Any] | None:
        """This env's benchmark's own figures over evaluation episodes (``toolrl eval`` puts
        them in ``results.json`` under ``env_metrics``), or None. Episodes the infrastructure
        failed (``infra_failure``) are among them: leave them out and count them, as toolrl's
        own figures do."""
        return None

    def oracle_action(self) -> str:
        """The scripted policy's next assistant message (default: ``row["oracle"][turn]``)."""
        script = (self.row or {}).get("oracle")
        if not script:
            raise OracleUnavailable(f"{type(self).__name__} has no scripted policy for this row")
        if self.turn >= len(script):
            raise OracleUnavailable(f"the row's oracle script has only {len(script)} turns")
        return script[self.turn]

    # --- the Gymnasium API -------------------------------------------------------------------
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        row = copy.deepcopy(dict(options)) if options else self.sample_task()
        self.row = row
        self.turn = 0
        self.done = False
        self.success = None
        self.setup(row)
        self._tools = {}
        for t in self.episode_tools():
            if t.name in self._tools:
                raise ValueError(f"{type(self).__name__}: two tools are named {t.name!r}")
            self._tools[t.name] = t
        self.messages = self.initial_messages(row)
        info = {"tools": self.tools_schema(), "format": self.format_name,
                "task_id": row.get("id"), "category": row.get("category")}
        return copy.deepcopy(self.messages), info

    def tools_schema(self) -> list[dict[str, Any]]:
        """The current episode's tools as OpenAI schemas (fresh copies)."""
        tools = self._tools.values() if self._tools else self.episode_tools()
        return [t.schema for t in tools]

    @property
    def tools(self) -> dict[str, Tool]:
        return dict(self._tools)

    async def astep(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Run one assistant turn: parse, validate, call tools concurrently, observe."""
        if self.row is None or self.done:
            raise gym.error.ResetNeeded("call reset() before step(); the episode "
                                        + ("has not started" if self.row is None else "is over"))
        if not isinstance(action, str):
            raise TypeError(f"the action is the assistant's message text, got "
                            f"{type(action).__name__}")
        self.turn += 1
        self.messages.append({"role": "assistant", "content": action})
        parsed = self.parser.parse(action)  # the turn's one parse (rewards read it)
        cap = self.max_calls_per_turn
        skipped = 0 if cap is None else len(parsed.calls) - cap
        parse = parsed
        if skipped > 0:  # the turn's calls are the ones that ran
            parse = dataclasses.replace(parse, calls=parse.calls[:self.max_calls_per_turn])
        if len(parse.calls) == 1:  # the common case: no task to schedule, no loop round trip
            results = [await self._call(parse.calls[0])]
        else:
            results = list(await asyncio.gather(*(self._call(c) for c in parse.calls)))
        observation = [self._tool_message(c, r) for c, r in zip(parse.calls, results, strict=True)]
        errors = [r.error for r in results if r.error is not None]
        if skipped > 0:
            error = make_error("too_many_calls", None,
                               f"{skipped + self.max_calls_per_turn} calls in one turn; only the "
                               f"first {self.max_calls_per_turn} ran, the other {skipped} did not")
            error["dropped"] = skipped
            errors.append(error)
            observation.append({"role": "tool", "name": "too_many_calls",
                                "content": error_observation(error)})
        parse_errors = parse_error_records(parse)
        errors.extend(parse_errors)
        for error in parse_errors[:self.max_parse_errors_shown]:
            observation.append({"role": "tool", "name": "parse_error",
                                "content": error_observation(error)})
        turn = self.on_turn(parse, results)
        observation.extend(turn.messages)
        info: dict[str, Any] = {"calls": list(parse.calls), "parse": parsed, "results": results,
                                "errors": errors, "latencies": [r.latency for r in results],
                                "turn": self.turn}
        reward = 0.0
        if turn.reward is not None:
            info["turn_reward"] = float(turn.reward)
            reward += float(turn.reward)
        terminated = bool(turn.terminated)
        truncated = not terminated and self.turn >= self.max_turns
        if terminated or truncated:
            end = await self.end_episode("max_turns" if truncated else "terminated")
            reward += end.pop("outcome_reward")
            info.update(end)
        self.messages.extend(copy.deepcopy(observation))
        return observation, reward, terminated, truncated, info

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Sync shim over `astep` (runs it on the env's private event loop)."""
        return self.run_sync(self.astep(action))

    async def end_episode(self, reason: str) -> dict[str, Any]:
        """Close the episode now (also used by the MaxTurns wrapper): evaluate the outcome and
        return ``{"success", "end_reason", "outcome_reward"}``."""
        self.done = True
        self.success = bool(await self.aevaluate())
        return {"success": self.success, "end_reason": reason,
                "outcome_reward": float(self.outcome_reward(self.success))}

    def close(self) -> None:
        loop, self._sync_loop = self._sync_loop, None
        # (a loop still running belongs to a step abandoned at its timeout: left to its thread)
        if loop is not None and not loop.is_closed() and not loop.is_running():
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # called from sync code: wait for the loop's executor
                loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
        super().close()

    # --- helpers -----------------------------------------------------------------------------
    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine to completion from sync code (a private loop per env instance)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._sync_loop is None or self._sync_loop.is_closed():
                self._sync_loop = asyncio.new_event_loop()
            return self._sync_loop.run_until_complete(coro)
        # Called from inside a running loop (e.g. a notebook): use a helper thread.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, coro).result()

    async def _call(self, call: ToolCall) -> ToolResult:
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            error = make_error("unknown_tool", call.name,
                               f"unknown tool {call.name!r}; available: {known}")
            return ToolResult(call.name, error_observation(error), error)
        return await tool.acall(call.arguments, timeout=self.tool_timeout,
                                max_output_chars=self.max_output_chars)

    @staticmethod
    def _tool_message(call: ToolCall, result: ToolResult) -> Message:
        message: Message = {"role": "tool", "name": call.name, "content": result.content}
        if call.id is not None:
            message["tool_call_id"] = call.id
        return message

    def render_calls(self, calls: list[ToolCall], text: str = "") -> str:
        """Assistant text making ``calls`` in this env's format (scripted policies use it)."""
        return self.parser.render(calls, text)


def submit_tool(answer_type: type = float) -> Tool:
    """A ``submit(answer)`` tool for a `SubmitAnswer` env: it records ``self.submitted``.

    Assign it in the class body where the tool should be listed (tools are offered in
    definition order): ``submit = submit_tool(float)`` (or ``str`` for a text answer).
    """

    def submit(self: Any, answer: Any) -> str:
        """Submit the final answer."""
        self.submitted = answer
        return "submitted"

    submit.__annotations__ = {"answer": answer_type, "return": str}
    return Tool.from_function(submit, inline=True)


class SubmitAnswer(ToolEnv):
    """A `ToolEnv` whose episode ends when the model submits an answer (a `submit_tool` call
    that succeeded) or writes a message without any call. ``self.submitted`` holds the answer
    (None before a submit); the state snapshot is ``{"submitted": ...}``."""

    submitted: Any = None

    def on_turn(self, parse: ParseResult, results: list[ToolResult]) -> Turn:
        submitted = any(c.name == "submit" and r.ok
                        for c, r in zip(parse.calls, results, strict=True))
        return Turn(terminated=submitted or (not parse.calls and not parse.errors))

    def state_snapshot(self) -> dict[str, Any]:
        return {"submitted": self.submitted}


# --- running episodes --------------------------------------------------------------------------
Policy = Callable[[Any, list[Message]], "str | Awaitable[str]"]


def resolve_astep(env: gym.Env) -> Callable[[str], Awaitable[tuple]]:
    """The nearest ``astep`` through a wrapper chain (plain gymnasium wrappers have none)."""
    current: Any = env
    while True:
        method = getattr(type(current), "astep", None)
        if method is not None:
            return current.astep
        if isinstance(current, gym.Wrapper):
            current = current.env
            continue
        raise TypeError(f"{type(env).__name__} has no astep(): not a ToolEnv")


def tasks_by_kind(make_task: Callable[[random.Random, str], dict[str, Any]],
                  kinds: Sequence[str], n: int, *, seed: int, split: str, name: str,
                  prefix: str) -> list[dict[str, Any]]:
    """``n`` task rows of ``make_task(rng, kind)`` for a `ToolEnv.make_tasks`: every kind in
    turn when ``n`` covers them all, else kinds drawn at random; ids
    ``{prefix}-{split}-{seed}-{i}``, the draws seeded by ``{name}:{split}:{seed}``."""
    rng = random.Random(f"{name}:{split}:{seed}")
    kinds = list(kinds)
    return [{"id": f"{prefix}-{split}-{seed}-{i}",
             **make_task(rng, kinds[i % len(kinds)] if n >= len(kinds) else rng.choice(kinds))}
            for i in range(n)]


def make_tasks_by_kind(make_task: Callable[[random.Random, str], dict[str, Any]], *,
                       name: str, prefix: str) -> classmethod:
    """A `ToolEnv.make_tasks` of rows in the class's ``KINDS`` (`tasks_by_kind`):
    ``make_tasks = toolrl.make_tasks_by_kind(make_task, name="my_env", prefix="my")``. It takes
    ``kinds`` (some of ``KINDS``) and nothing else, so a mistyped ``data.task_kwargs`` key is
    refused, not ignored."""

    def make_tasks(cls: type, n: int, seed: int = 0, split: str = "train",
                   kinds: Sequence[str] | None = None) -> list[dict[str, Any]]:
        unknown = sorted(set(kinds or ()) - set(cls.KINDS))
        if unknown:
            raise ValueError(f"kinds: {unknown} are not {cls.__name__}'s; choose from "
                             f"{list(cls.KINDS)}")
        return tasks_by_kind(make_task, kinds or cls.KINDS, n, seed=seed, split=split,
                             name=name, prefix=prefix)

    make_tasks.__doc__ = f"``n`` rows of the {name} task kinds (`toolrl.tasks_by_kind`)."
    return classmethod(make_tasks)


def oracle_policy(env: gym.Env, messages: list[Message]) -> str:
    """The env's scripted policy (``env.unwrapped.oracle_action()``)."""
    return env.unwrapped.oracle_action()


async def run_episode(env: gym.Env, policy: Policy = oracle_policy, *,
                      row: dict[str, Any] | None = None, seed: int | None = None,
                      max_steps: int = 100, record_errors: bool = False) -> Trajectory:
    """Play one episode with ``policy(env, messages) -> action`` (sync or async) and return
    its `Trajectory` (no tokens: the policy speaks text).

    The default policy is the env's scripted oracle, which makes correct transcripts for tests
    and for a supervised warm start. An episode not over after ``max_steps`` actions, or an
    exception of the env, raises; with ``record_errors`` the episode ends as a rollout ends it
    instead (``max_turns``; ``error`` with the exception described; the final state as plain
    data). What the policy raises always propagates.
    """
    traj = Trajectory(row=dict(row or {}), seed=seed)
    try:
        observation, info = env.reset(seed=seed, options=row)
    except Exception as exc:
        if not record_errors:
            raise
        traj.finish("error", error=f"reset: {describe_exception(exc)}")
        return traj
    base = env.unwrapped
    traj.messages, traj.row = list(observation), copy.deepcopy(base.row or row or {})
    traj.tools, traj.format = list(info.get("tools") or []), info.get("format")
    astep = resolve_astep(env)
    reason, info, error = "max_turns", {}, None
    for _ in range(max_steps):
        action = policy(env, traj.messages)
        if inspect.isawaitable(action):
            action = await action
        traj.messages.append({"role": "assistant", "content": action})
        start = time.perf_counter()
        try:
            observation, reward, terminated, truncated, info = await astep(action)
        except Exception as exc:
            if not record_errors:
                raise
            traj.turns.append(TurnRecord(action=action, parse=base.parser.parse(action)))
            reason, info, error = "error", {}, f"step: {describe_exception(exc)}"
            break
        turn = TurnRecord.from_step(action, reward, info)
        turn.env_s = time.perf_counter() - start
        traj.turns.append(turn)
        traj.messages.extend(observation)
        if terminated or truncated:
            reason = "terminated" if terminated else "truncated"
            break
    else:
        if not record_errors:
            raise RuntimeError(f"episode did not end within {max_steps} steps")
        info = {}
    if not record_errors:
        traj.finish(reason, info, base.state_snapshot())
        return traj
    try:  # as the rollout records it: the final state on every finish, when it has one
        state = plain(base.state_snapshot())
    except Exception as exc:
        state, error = None, error or f"state_snapshot: {describe_exception(exc)}"
    traj.finish(reason, info, state, error)
    return traj
