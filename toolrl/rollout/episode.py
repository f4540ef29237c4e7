"""One multi-turn episode, token in / token out.

`EpisodeRunner.run` resets a tool env with a task row, renders the first prompt, then loops:
generate a turn on the engine, decode it, ``await env.astep(text)`` (the env parses the calls
with its tool-call format, runs them and returns the new messages), append the tokens of those
messages (a template delta, never a re-render) within the token budget, until the env
terminates or truncates, or the budget runs out. It records:

- every token id (prompt, then the response: sampled turns and observation deltas);
- the response mask: 1 exactly on tokens the engine sampled, 0 on everything appended;
- the engine's log-prob beside each response token (0.0 where nothing was sampled);
- turn boundaries, per-turn rewards, tool calls, errors and latencies, the finish reason,
  the env's final info (success), its state snapshot and the message list.

Finish reasons: ``terminated`` / ``truncated`` (the env ended the episode), ``length`` (a model
turn ran into the response budget), ``context`` (an observation or the prompt does not fit),
``max_turns`` (the runner's own safety cap), ``error`` (the env or the template failed on this
episode's input; recorded, never raised).

The loop is built from small methods meant to be overridden: `EpisodeRunner.generate_turn`
(how a model turn is produced: one engine call by default; several for a two-stage generate),
`turn_sampling`, `decode`, `step_env`, `observe`. A turn is a `TurnOutput` whose own mask says
which of its tokens were sampled, so a subclass may insert fixed tokens mid-turn.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from toolrl.rollout.chat import ChatRenderer, TemplateError
from toolrl.rollout.engine import Completion, SamplingConfig, VLLMEngine

logger = logging.getLogger(__name__)

FINISH_REASONS = ("terminated", "truncated", "length", "context", "max_turns", "error")


@dataclass
class EpisodeConfig:
    """Budget and sampling of one episode.

    Attributes:
        sampling: per-turn sampling (``max_tokens`` is per turn; also bounded by the budget).
        max_prompt_len: most tokens of the first prompt (default: the engine's context - 1).
        max_response_len: most response tokens, sampled and appended together (default: the
            room the context window leaves after the prompt).
        max_turns: a safety cap on model turns (the env has its own limit).
        on_overflow: when an observation does not fit: ``"stop"`` appends none of it,
            ``"truncate"`` appends the part that fits; either way the episode ends (``context``).
        min_turn_tokens: end with ``context`` when less room than this is left for a turn.
    """

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_prompt_len: int | None = None
    max_response_len: int | None = None
    max_turns: int = 32
    on_overflow: Literal["stop", "truncate"] = "stop"
    min_turn_tokens: int = 1

    def __post_init__(self) -> None:
        if self.on_overflow not in ("stop", "truncate"):
            raise ValueError(f"on_overflow must be 'stop' or 'truncate', got {self.on_overflow!r}")
        if self.max_turns < 1 or self.min_turn_tokens < 1:
            raise ValueError("max_turns and min_turn_tokens must be >= 1")


@dataclass
class TurnOutput:
    """The tokens of one model turn: ids, engine log-probs and which tokens were sampled."""

    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    finish_reason: str = "stop"
    stop_reason: int | str | None = None

    @classmethod
    def from_completion(cls, completion: Completion) -> TurnOutput:
        out = cls(finish_reason=completion.finish_reason, stop_reason=completion.stop_reason)
        out.extend(completion.token_ids, completion.log_probs, sampled=True)
        return out

    def extend(self, token_ids: Sequence[int], log_probs: Sequence[float] | None = None,
               sampled: bool = True) -> None:
        """Add tokens: sampled ones need their log-probs; inserted ones get mask 0, log-prob 0."""
        ids = [int(t) for t in token_ids]
        if sampled:
            if log_probs is None or len(log_probs) != len(ids):
                raise ValueError("sampled tokens need one log-prob each (SamplingConfig.logprobs)")
            self.log_probs.extend(float(x) for x in log_probs)
        else:
            self.log_probs.extend([0.0] * len(ids))
        self.token_ids.extend(ids)
        self.mask.extend([int(sampled)] * len(ids))

    def add(self, completion: Completion) -> None:
        """Append another engine completion (e.g. the second stage of a turn)."""
        self.extend(completion.token_ids, completion.log_probs, sampled=True)
        self.finish_reason, self.stop_reason = completion.finish_reason, completion.stop_reason


@dataclass
class EpisodeState:
    """Everything about one running episode; hooks read and extend it."""

    env: Any
    row: dict[str, Any]
    tools: list[dict[str, Any]]
    format: str | None
    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    max_response_len: int
    seed: int | None = None
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    final_info: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    finish_reason: str | None = None
    error: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # free room for subclasses

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def room(self) -> int:
        """Response tokens still allowed."""
        return self.max_response_len - len(self.response_ids)

    def append(self, token_ids: Sequence[int], log_probs: Sequence[float] | None = None,
               mask: Sequence[int] | None = None) -> tuple[int, int]:
        """Append response tokens; returns their [start, end) span in the response."""
        n = len(token_ids)
        mask = [0] * n if mask is None else list(mask)
        log_probs = [0.0] * n if log_probs is None else list(log_probs)
        if not (len(mask) == len(log_probs) == n):
            raise ValueError(f"{n} tokens, {len(mask)} mask values, {len(log_probs)} log-probs")
        if n > self.room:
            raise ValueError(f"{n} tokens do not fit the {self.room} left in the budget")
        start = len(self.response_ids)
        self.response_ids.extend(int(t) for t in token_ids)
        self.response_mask.extend(int(m) for m in mask)
        self.log_probs.extend(float(x) if m else 0.0 for x, m in zip(log_probs, mask,
                                                                    strict=True))
        return start, len(self.response_ids)

    def end(self, reason: str, error: str | None = None) -> None:
        if reason not in FINISH_REASONS:
            raise ValueError(f"unknown finish reason {reason!r}; one of {FINISH_REASONS}")
        self.done, self.finish_reason, self.error = True, reason, error


@dataclass
class EpisodeResult:
    """A finished episode: tokens for training and a JSON-able record for rewards and logs."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    log_probs: list[float]
    finish_reason: str
    success: bool
    reward: float
    rewards: list[float]
    turns: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    state: dict[str, Any]
    final_info: dict[str, Any]
    error: str | None = None
    task_id: Any = None
    seed: int | None = None
    timing: dict[str, float] = field(default_factory=dict)
    format: str | None = None  # the env's tool-call format (rewards re-parse with it)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def record(self) -> dict[str, Any]:
        """The per-episode record stored under ``toolrl.batch.EPISODES``."""
        return {
            "task_id": self.task_id, "seed": self.seed, "finish_reason": self.finish_reason,
            "success": self.success, "reward": self.reward, "turn_rewards": list(self.rewards),
            "num_turns": self.num_turns, "turns": self.turns, "messages": self.messages,
            "tools": self.tools, "state": self.state, "final_info": self.final_info,
            "error": self.error, "prompt_len": len(self.prompt_ids),
            "response_len": len(self.response_ids),
            "num_sampled_tokens": int(sum(self.response_mask)), "timing": self.timing,
            "format": self.format,
        }


class EpisodeRunner:
    """Runs episodes on one engine with one chat renderer. Subclass to change the loop.

    Args:
        engine: the `VLLMEngine` (anything with its ``generate`` coroutine and
            ``max_model_len``).
        renderer: the `ChatRenderer` of the engine's tokenizer.
        config: budget and sampling.
    """

    def __init__(self, engine: VLLMEngine, renderer: ChatRenderer,
                 config: EpisodeConfig | None = None) -> None:
        self.engine = engine
        self.renderer = renderer
        self.tokenizer = renderer.tokenizer
        self.config = config or EpisodeConfig()
        limit = int(engine.max_model_len)
        self.max_prompt_len = min(self.config.max_prompt_len or limit - 1, limit - 1)
        if self.config.max_response_len is not None and \
                self.max_prompt_len + self.config.max_response_len > limit:
            self.max_prompt_len = limit - self.config.max_response_len
            if self.max_prompt_len < 1:
                raise ValueError(f"max_response_len={self.config.max_response_len} leaves no "
                                 f"room for a prompt in the context window of {limit}")

    # --- the loop ---------------------------------------------------------------------------
    async def run(self, env: Any, row: Mapping[str, Any] | None = None, *,
                  seed: int | None = None) -> EpisodeResult:
        """Play one episode of ``env`` from task ``row``."""
        t0 = time.perf_counter()
        state = await self.start(env, row, seed)
        while not state.done:
            await self.play_turn(state)
        result = self.finish(state)
        result.timing["total_s"] = time.perf_counter() - t0
        return result

    async def start(self, env: Any, row: Mapping[str, Any] | None,
                    seed: int | None) -> EpisodeState:
        """Reset the env and render the first prompt."""
        row = dict(row or {})
        try:
            messages, info = env.reset(seed=seed, options=row or None)
            tools = list(info.get("tools") or [])
            prompt = self.renderer.render_prompt(messages, tools)
        except Exception as e:  # a bad row or template: this episode fails, the batch goes on
            return self.failed_state(env, row, seed, f"reset: {type(e).__name__}: {e}")
        limit = self.engine.max_model_len - len(prompt)
        budget = min(self.config.max_response_len or limit, limit)
        state = EpisodeState(env, row, tools, info.get("format"), list(messages), prompt,
                             max(budget, 0), seed=seed)
        if len(prompt) > self.max_prompt_len:  # keep a (cut) prompt so the row is not empty
            state.prompt_ids, state.max_response_len = prompt[-self.max_prompt_len:], 0
            state.end("context", f"the prompt has {len(prompt)} tokens, more than "
                                 f"max_prompt_len={self.max_prompt_len}")
        return state

    def failed_state(self, env: Any, row: Mapping[str, Any], seed: int | None,
                     error: str) -> EpisodeState:
        """A finished state for an episode that could not start (finish reason ``error``)."""
        logger.warning("episode %s failed to start: %s", row.get("id"), error)
        # one placeholder token keeps the batch row non-empty; its response is empty
        state = EpisodeState(env, dict(row), [], None, list(row.get("messages") or []),
                             [self.renderer.eos_token_id], 0, seed=seed)
        state.end("error", error)
        return state

    def failed(self, row: Mapping[str, Any], seed: int | None, error: str) -> EpisodeResult:
        """The result of an episode that could not even get an env."""
        return self.finish(self.failed_state(None, row, seed, error))

    async def play_turn(self, state: EpisodeState) -> None:
        """Generate one model turn, step the env, append the observation."""
        if len(state.turns) >= self.config.max_turns:
            state.end("max_turns")
            return
        if state.room < self.config.min_turn_tokens:
            state.end("context")
            return
        t0 = time.perf_counter()
        out = await self.generate_turn(state)
        gen_s = time.perf_counter() - t0
        if not out.token_ids:
            state.end("error", "the turn produced no tokens")
            return
        start, end = state.append(out.token_ids, out.log_probs, out.mask)
        text = self.decode(state, out)
        state.messages.append({"role": "assistant", "content": text})
        turn: dict[str, Any] = {"index": len(state.turns), "start": start, "end": end,
                                "finish_reason": out.finish_reason, "text": text,
                                "gen_s": gen_s}
        state.turns.append(turn)
        if out.finish_reason == "length" and state.room <= 0:
            state.end("length")  # cut by the budget: nothing sensible to send the env
            return
        t1 = time.perf_counter()
        try:
            observation, reward, terminated, truncated, info = await self.step_env(state, text)
        except Exception as e:
            logger.warning("env step failed in episode %s: %s", state.row.get("id"), e)
            state.end("error", f"step: {type(e).__name__}: {e}")
            return
        turn["env_s"] = time.perf_counter() - t1
        state.rewards.append(float(reward))
        turn.update(_turn_info(info, float(reward)))
        state.messages.extend(observation)
        if terminated or truncated:
            state.final_info = _jsonable({k: v for k, v in info.items()
                                          if k not in ("parse", "calls")})
            state.end("terminated" if terminated else "truncated")
            return
        ended_with_eos = out.token_ids[-1] == self.renderer.eos_token_id
        await self.observe(state, observation, ended_with_eos)

    async def generate_turn(self, state: EpisodeState) -> TurnOutput:
        """Produce one model turn (override for multi-stage generation or scripted turns)."""
        completion = (await self.engine.generate(state.token_ids, self.turn_sampling(state)))[0]
        return TurnOutput.from_completion(completion)

    def turn_sampling(self, state: EpisodeState, offset: int = 0,
                      **changes: Any) -> SamplingConfig:
        """This turn's sampling: the config's, bounded by the budget, seeded per turn.

        ``offset`` is the number of tokens this turn already has (several engine calls in
        one turn), so that every call gets its own seed.
        """
        base = self.config.sampling
        changes.setdefault("max_tokens", min(base.max_tokens, state.room - offset))
        changes.setdefault("n", 1)
        if state.seed is not None:
            position = len(state.response_ids) + offset
            changes.setdefault("seed", (state.seed * 1_000_003 + 7919 * len(state.turns)
                                        + position) % (2**31 - 1))
        return base.replace(**changes)

    def decode(self, state: EpisodeState, turn: TurnOutput) -> str:
        """The assistant message text the env receives."""
        return self.tokenizer.decode(turn.token_ids, skip_special_tokens=True)

    async def step_env(self, state: EpisodeState, text: str
                       ) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        """``await env.astep(text)`` through any wrappers."""
        from toolrl.core.env import resolve_astep

        return await resolve_astep(state.env)(text)

    async def observe(self, state: EpisodeState, observation: Sequence[Mapping[str, Any]],
                      ended_with_eos: bool) -> None:
        """Append the observation delta (mask 0) if it fits; otherwise end with ``context``."""
        try:
            delta = self.renderer.render_delta(observation, state.tools,
                                               after_eos=ended_with_eos)
        except TemplateError as e:
            state.end("error", f"template: {e}")
            return
        except Exception as e:  # e.g. text the tokenizer rejects: this episode ends, not the batch
            state.end("error", f"observation: {type(e).__name__}: {e}")
            return
        turn = state.turns[-1]
        if len(delta) + self.config.min_turn_tokens > state.room:
            if self.config.on_overflow == "truncate" and state.room > 0:
                turn["obs_start"], turn["obs_end"] = state.append(delta[: state.room])
            state.end("context")
            return
        turn["obs_start"], turn["obs_end"] = state.append(delta)

    def finish(self, state: EpisodeState) -> EpisodeResult:
        success = bool(state.final_info.get("success", False))
        snapshot: dict[str, Any] = {}
        if state.env is not None:
            try:
                getter = getattr(state.env, "state_snapshot", None) or \
                    state.env.unwrapped.state_snapshot
                snapshot = _jsonable(getter())
            except Exception as e:
                logger.warning("state_snapshot failed: %s", e)
        gen = sum(t.get("gen_s", 0.0) for t in state.turns)
        env_s = sum(t.get("env_s", 0.0) for t in state.turns)
        return EpisodeResult(
            prompt_ids=list(state.prompt_ids), response_ids=list(state.response_ids),
            response_mask=list(state.response_mask), log_probs=list(state.log_probs),
            finish_reason=state.finish_reason or "error", success=success,
            reward=float(sum(state.rewards)), rewards=list(state.rewards),
            turns=state.turns, messages=_jsonable(state.messages), tools=state.tools,
            state=snapshot, final_info=state.final_info, error=state.error,
            task_id=state.row.get("id"), seed=state.seed,
            timing={"generate_s": gen, "env_s": env_s}, format=state.format)


def _turn_info(info: Mapping[str, Any], reward: float) -> dict[str, Any]:
    parse = info.get("parse")
    out: dict[str, Any] = {
        "reward": reward,
        "calls": [_jsonable(c) for c in info.get("calls", [])],
        "errors": _jsonable(list(info.get("errors", []))),
        "latencies": [float(x) for x in info.get("latencies", [])],
    }
    if "turn_reward" in info:
        out["turn_reward"] = float(info["turn_reward"])
    if parse is not None:
        out["parse_ok"] = bool(getattr(parse, "ok", True))
        out["repaired"] = bool(getattr(parse, "repaired", False))
    return out


def _jsonable(value: Any) -> Any:
    """Plain JSON-able data (dataclasses as dicts; unknown objects as strings)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        to_dict = getattr(value, "to_dict", None)
        return _jsonable(to_dict() if callable(to_dict) else dataclasses.asdict(value))
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    return str(value)


__all__ = [
    "FINISH_REASONS",
    "EpisodeConfig",
    "EpisodeResult",
    "EpisodeRunner",
    "EpisodeState",
    "TurnOutput",
]
