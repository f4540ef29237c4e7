"""`Trajectory`: the one record of a finished episode, from the rollout to the rewards to the
trainer.

The episode runner (`toolrl.rollout.episode.EpisodeRunner`) produces it, `run_episode` too (a
policy of your own, e.g. the env's scripted oracle); the rollout batch carries one per sample
(``toolrl.batch.TRAJECTORIES``); reward plugins, credit assignment, metrics, rollout dumps,
``toolrl eval`` and the warm start read it. What a reward receives::

    traj.row              the task row: id, ground_truth, category, expected_state, ...
    traj.messages         the whole chat (system, user, assistant, tool messages)
    traj.turns[i]         one `TurnRecord` per assistant turn:
        .action               the assistant's text
        .parse                the env's `ParseResult` of it: calls, parse errors, repaired
        .results              one `ToolOutput` per call that ran: content, typed error, latency
        .errors               every typed error of the turn (``info["errors"]``: tool errors,
                              parse errors, too_many_calls, output_truncated)
        .reward               the env's per-turn reward (None when the env gives none)
        .action_span          [start, end) of the turn's tokens in the response
        .observation_span     [start, end) of the observation tokens after it (None: none)
    traj.success / .info  the env's outcome and its final step info
    traj.final_state      the env's `state_snapshot()` at the end
    traj.finish_reason    terminated | truncated | length | context | max_turns | error
    traj.infra_failure    None, or why the infrastructure (not the policy) failed the episode:
                          tool_unreachable | env_exception | env_timeout | agent_crash |
                          agent_timeout; the
                          trainer keeps such episodes out of the loss and reward statistics
    traj.tools / .format  the tool schemas offered and the tool-call format
    traj.sampled_tokens   tokens the policy generated (prompt_tokens, response_tokens too)
    traj.policy_version   the weights that generated it; .timing: seconds spent

Each action is parsed once, by the env, when it runs the turn; rewards read ``turn.parse`` and
never parse again. A turn the env never saw (cut by the token budget, or a failed env step)
carries the parse of the env's format, made by the runner.

It is plain data and round-trips through JSON (`to_dict` / `from_dict`) without loss, so it
crosses processes inside a TensorDict ``NonTensorStack``, goes to reward services and pools,
and lands in rollout dumps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl.core.types import ParseResult, ToolCall, as_tool_call

__all__ = ["FINISH_REASONS", "INFRA_FAILURES", "TokenStream", "ToolOutput", "Trajectory",
           "TurnRecord", "plain"]

FINISH_REASONS = ("terminated", "truncated", "length", "context", "max_turns", "error")
"""Why an episode ended: the env ended it (``terminated``) or cut it (``truncated``); a model
turn ran into the response budget (``length``); an observation or the prompt did not fit
(``context``); the runner's own turn cap (``max_turns``); the env or the template failed on
this episode's input (``error``)."""

INFRA_FAILURES = ("tool_unreachable", "env_exception", "env_timeout", "agent_crash",
                  "agent_timeout")
"""Why the infrastructure failed an episode (`Trajectory.infra_failure`), as opposed to a
policy failure (a bad call, a wrong answer): a tool's server could not be reached or dropped
the connection (a tool error with ``"infra": True``, see `toolrl.core.tools.ToolFailure`);
the env raised (make_env, reset or step); an env step ran past ``rollout.env_timeout_s``; the
episode loop itself crashed (or a ``rollout.agent`` raised or never called the model); a
``rollout.agent`` ran past ``rollout.agent_timeout_s``."""

Span = tuple[int, int]


def _empty_parse() -> ParseResult:
    return ParseResult(calls=[], text="")


@dataclass
class ToolOutput:
    """One call the env ran: the observation text, a typed error (None on success) and the
    seconds it took (validation included)."""

    name: str
    content: str = ""
    error: dict[str, Any] | None = None
    latency: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None or self.error.get("type") == "output_truncated"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "content": self.content, "error": self.error,
                "latency": self.latency}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolOutput:
        error = data.get("error")
        return cls(name=data["name"], content=data.get("content", ""),
                   error=None if error is None else dict(error),
                   latency=float(data.get("latency", 0.0)))


@dataclass
class TurnRecord:
    """One assistant turn and what the env made of it (see the module docstring)."""

    action: str = ""
    parse: ParseResult = field(default_factory=_empty_parse)
    results: list[ToolOutput] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None  # the env's per-turn reward (`toolrl.core.env.Turn.reward`)
    env_reward: float = 0.0  # what the env's step returned (per-turn + outcome at the end)
    action_span: Span | None = None
    observation_span: Span | None = None
    finish_reason: str = "stop"  # the engine's: stop | length | abort
    generate_s: float = 0.0
    env_s: float = 0.0

    @property
    def calls(self) -> list[ToolCall]:
        """The calls the turn made (as parsed; `results` has the ones that ran)."""
        return list(self.parse.calls)

    @property
    def dropped_calls(self) -> int:
        """Calls of the turn that did not run: past the env's ``max_calls_per_turn``."""
        return sum(int(e.get("dropped", 0)) for e in self.errors
                   if e.get("type") == "too_many_calls")

    @classmethod
    def from_step(cls, action: str, reward: float, info: Mapping[str, Any],
                  parser: Any = None) -> TurnRecord:
        """The record of one ``env.astep(action)``: its parse, tool results, errors and
        rewards from the step's ``info``. An env whose info has no ``parse`` (not a `ToolEnv`)
        gets ``parser.parse(action)`` when a parser is given."""
        parse = info.get("parse")
        if parse is None:
            parse = parser.parse(action) if parser is not None else _empty_parse()
        turn_reward = info.get("turn_reward")
        return cls(action=action, parse=parse,
                   results=[ToolOutput(name=r.name, content=r.content,
                                       error=plain(r.error), latency=float(r.latency))
                            for r in info.get("results") or []],
                   errors=plain(list(info.get("errors") or [])),
                   reward=None if turn_reward is None else float(turn_reward),
                   env_reward=float(reward))

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "parse": self.parse.to_dict(),
                "results": [r.to_dict() for r in self.results],
                "errors": [dict(e) for e in self.errors], "reward": self.reward,
                "env_reward": self.env_reward,
                "action_span": None if self.action_span is None else list(self.action_span),
                "observation_span": None if self.observation_span is None
                else list(self.observation_span),
                "finish_reason": self.finish_reason, "generate_s": self.generate_s,
                "env_s": self.env_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TurnRecord:
        parse = data.get("parse")
        reward = data.get("reward")
        return cls(action=data.get("action") or "",
                   parse=_empty_parse() if parse is None else ParseResult.from_dict(parse),
                   results=[ToolOutput.from_dict(r) for r in data.get("results") or []],
                   errors=[dict(e) for e in data.get("errors") or []],
                   reward=None if reward is None else float(reward),
                   env_reward=float(data.get("env_reward", 0.0)),
                   action_span=_span(data.get("action_span")),
                   observation_span=_span(data.get("observation_span")),
                   finish_reason=data.get("finish_reason", "stop"),
                   generate_s=float(data.get("generate_s", 0.0)),
                   env_s=float(data.get("env_s", 0.0)))


@dataclass
class TokenStream:
    """The episode's tokens: the prompt, then the response (sampled turns and observation
    deltas); ``response_mask`` is 1 exactly on sampled tokens, ``log_probs`` the engine's
    log-prob beside each response token (0.0 where nothing was sampled), ``versions`` the
    weight version that sampled each response token (-1 where nothing was sampled; empty: not
    recorded)."""

    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_ids": list(self.prompt_ids), "response_ids": list(self.response_ids),
                "response_mask": list(self.response_mask), "log_probs": list(self.log_probs),
                "versions": list(self.versions)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenStream:
        return cls(prompt_ids=[int(t) for t in data.get("prompt_ids") or []],
                   response_ids=[int(t) for t in data.get("response_ids") or []],
                   response_mask=[int(m) for m in data.get("response_mask") or []],
                   log_probs=[float(x) for x in data.get("log_probs") or []],
                   versions=[int(v) for v in data.get("versions") or []])


@dataclass
class Trajectory:
    """A finished episode (see the module docstring for what each field holds).

    ``tokens`` is the token stream as the runner produced it; the rollout worker moves it into
    the batch's tensors, so the copy in a batch has ``tokens=None`` and the spans index the
    batch's response row. ``extra`` is free room for a custom runner or env (JSON data).
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    row: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    format: str | None = None
    finish_reason: str = "terminated"
    success: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    final_state: dict[str, Any] | None = None
    error: str | None = None
    seed: int | None = None
    uid: str | None = None
    policy_version: int | None = None
    prompt_tokens: int = 0
    response_tokens: int = 0
    sampled_tokens: int = 0
    timing: dict[str, float] = field(default_factory=dict)
    tokens: TokenStream | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    infra_failure: str | None = None

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"unknown finish reason {self.finish_reason!r}; one of "
                             f"{FINISH_REASONS}")
        if self.infra_failure is not None and self.infra_failure not in INFRA_FAILURES:
            raise ValueError(f"unknown infra failure {self.infra_failure!r}; one of "
                             f"{INFRA_FAILURES}")

    # --- what rewards and metrics read -------------------------------------------------------
    @property
    def id(self) -> Any:
        """The task row's ``id`` (None when absent)."""
        return self.row.get("id")

    @property
    def ground_truth(self) -> Any:
        return self.row.get("ground_truth")

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def env_reward(self) -> float:
        """The sum of what the env's steps returned (per-turn rewards and the outcome)."""
        return float(sum(t.env_reward for t in self.turns))

    def parses(self) -> list[ParseResult]:
        """The parse of every turn, in order."""
        return [t.parse for t in self.turns]

    @property
    def calls(self) -> list[ToolCall]:
        """Every parsed call of every turn, in order."""
        return [c for t in self.turns for c in t.parse.calls]

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Every typed error of every turn, in order."""
        return [e for t in self.turns for e in t.errors]

    @property
    def dropped_calls(self) -> int:
        """Calls that did not run, past the env's ``max_calls_per_turn`` (every turn)."""
        return sum(t.dropped_calls for t in self.turns)

    def tool_names(self) -> set[str]:
        return {t.get("function", t).get("name") for t in self.tools}

    def turn_ends(self) -> list[int]:
        """The end (exclusive) of each turn's tokens in the response (0 for a turn without
        tokens): where credit assignment puts per-turn rewards."""
        return [t.action_span[1] if t.action_span is not None else 0 for t in self.turns]

    # --- construction and JSON ----------------------------------------------------------------
    def finish(self, reason: str, info: Mapping[str, Any] | None = None,
               final_state: Any = None, error: str | None = None) -> None:
        """Close the record: why the episode ended, the env's last step ``info`` (kept as plain
        data, without the turn's parse, calls and results, which live in the turns), the
        final state and an error. ``success`` is ``info["success"]`` (False without one, e.g.
        an episode cut by the budget), and ``info`` always holds it. A turn with an
        infrastructure tool error (``"infra": True``) makes ``infra_failure``
        ``tool_unreachable``."""
        if reason not in FINISH_REASONS:
            raise ValueError(f"unknown finish reason {reason!r}; one of {FINISH_REASONS}")
        self.finish_reason, self.error = reason, error
        self.info = plain({k: v for k, v in (info or {}).items()
                           if k not in ("parse", "calls", "results")})
        self.success = bool(self.info.get("success", False))
        self.info.setdefault("success", self.success)
        self.final_state = None if final_state is None else plain(final_state)
        if self.infra_failure is None and any(e.get("infra") for e in self.errors):
            self.infra_failure = "tool_unreachable"  # a tool's server was down, not the policy

    @classmethod
    def from_calls(cls, calls: Sequence[ToolCall | Mapping[str, Any]], row: Mapping[str, Any],
                   tools: Sequence[Mapping[str, Any]] = ()) -> Trajectory:
        """A one-turn trajectory whose turn made ``calls`` (offline scoring, tests)."""
        parsed = ParseResult(calls=[as_tool_call(c) for c in calls], text="")
        messages = [{"role": "assistant", "content": "",
                     "tool_calls": [c.to_openai() for c in parsed.calls]}]
        return cls(messages=messages, turns=[TurnRecord(parse=parsed)], row=dict(row),
                   tools=[dict(t) for t in tools])

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data; ``Trajectory.from_dict(t.to_dict()) == t``."""
        return {"messages": self.messages, "turns": [t.to_dict() for t in self.turns],
                "row": self.row, "tools": self.tools, "format": self.format,
                "finish_reason": self.finish_reason, "success": self.success,
                "info": self.info, "final_state": self.final_state, "error": self.error,
                "seed": self.seed, "uid": self.uid, "policy_version": self.policy_version,
                "prompt_tokens": self.prompt_tokens, "response_tokens": self.response_tokens,
                "sampled_tokens": self.sampled_tokens, "timing": self.timing,
                "tokens": None if self.tokens is None else self.tokens.to_dict(),
                "extra": self.extra, "infra_failure": self.infra_failure}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | Trajectory) -> Trajectory:
        """From `to_dict`'s data; an unknown key is an error (it names the valid ones)."""
        if isinstance(data, Trajectory):
            return data
        if not isinstance(data, Mapping):
            raise TypeError(f"a trajectory must be a Trajectory or a mapping, got {type(data)}")
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise ValueError(f"unknown trajectory key(s) {unknown}; valid: {sorted(_FIELDS)}")
        tokens = data.get("tokens")
        version = data.get("policy_version")
        return cls(messages=list(data.get("messages") or []),
                   turns=[TurnRecord.from_dict(t) for t in data.get("turns") or []],
                   row=dict(data.get("row") or {}), tools=list(data.get("tools") or []),
                   format=data.get("format"),
                   finish_reason=data.get("finish_reason", "terminated"),
                   success=bool(data.get("success", False)), info=dict(data.get("info") or {}),
                   final_state=data.get("final_state"), error=data.get("error"),
                   seed=data.get("seed"), uid=data.get("uid"),
                   policy_version=None if version is None else int(version),
                   prompt_tokens=int(data.get("prompt_tokens", 0)),
                   response_tokens=int(data.get("response_tokens", 0)),
                   sampled_tokens=int(data.get("sampled_tokens", 0)),
                   timing={k: float(v) for k, v in (data.get("timing") or {}).items()},
                   tokens=None if tokens is None else TokenStream.from_dict(tokens),
                   extra=dict(data.get("extra") or {}),
                   infra_failure=data.get("infra_failure"))


_FIELDS = frozenset(Trajectory.__dataclass_fields__)


def _span(value: Any) -> Span | None:
    return None if value is None else (int(value[0]), int(value[1]))


def plain(value: Any) -> Any:
    """JSON-able data (dataclasses as dicts, tuples as lists, numpy/torch scalars as numbers,
    anything else as its string)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        to_dict = getattr(value, "to_dict", None)
        return plain(to_dict() if callable(to_dict) else dataclasses.asdict(value))
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    return str(value)
