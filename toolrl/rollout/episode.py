"""One multi-turn episode, token in / token out, into a `Trajectory`.

`EpisodeRunner.run` resets a tool env with a task row, renders the first prompt, then loops:
generate a turn on the engine, decode it, ``await env.astep(text)`` (the env parses the calls
with its tool-call format, runs them and returns the new messages), append the tokens of those
messages (a template delta, never a re-render) within the token budget, until the env
terminates or truncates, or the budget runs out. The result is the episode's
`toolrl.core.trajectory.Trajectory`: per turn the action, the env's parse, tool results,
errors, rewards and token spans; per episode the finish reason, success, final info and state,
and the token stream (``tokens``):

- every token id (prompt, then the response: sampled turns and observation deltas);
- the response mask: 1 exactly on tokens the engine sampled, 0 on everything appended;
- the engine's log-prob beside each response token (0.0 where nothing was sampled).

Finish reasons: `toolrl.core.trajectory.FINISH_REASONS` (``error``: the env or the template
failed on this episode's input; recorded, never raised). An episode the infrastructure failed
(the env raised, an env step ran past ``EpisodeConfig.env_timeout_s``, a tool's server was
unreachable) also gets ``Trajectory.infra_failure``, so the trainer can tell it from a policy
failure.

With a template that rewrites history (`toolrl.rollout.history`, ``per_turn``: the renderer's
decision), nothing is appended after a turn: the next turn gets a fresh prompt, the
template's rendering of the history as at inference (earlier turns as
`ChatRenderer.inference_message` hands them back), and starts a sample of its own. The
trajectory then holds the last sample in ``tokens`` and the earlier ones in
``extra["per_turn"]["streams"]``; `toolrl.rollout.samples.episode_rows` makes them rows that
share the episode's advantage.

The loop is built from small methods meant to be overridden: `EpisodeRunner.generate_turn`
(how a model turn is produced: one engine call by default; several for a two-stage generate),
`turn_sampling`, `decode`, `step_env`, `observe`. A turn is a `TurnOutput` whose own mask says
which of its tokens were sampled, so a subclass may insert fixed tokens mid-turn.

The env of each episode gets the engine as a chat model of its own (``env.rollout_model``, an
`toolrl.rollout.env_model.EngineChatModel`; `env_model`), e.g. for a simulated user: what it
samples reaches the episode only as the env's messages (mask 0). An env that declares
``blocking_step`` resets and steps on a thread of its own, so its sync code may call it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from toolrl.core.env import ToolEnv, resolve_astep
from toolrl.core.errors import describe_exception
from toolrl.core.parse import get_format
from toolrl.core.tools import in_daemon_thread
from toolrl.core.trajectory import TokenStream, Trajectory, TurnRecord, plain
from toolrl.rollout.chat import ChatRenderer, TemplateError
from toolrl.rollout.engine import Completion, SamplingConfig, VLLMEngine
from toolrl.rollout.env_model import EngineChatModel
from toolrl.rollout.loop_hold import Hold, held, run_coroutine, timed_call, warn_if_held

logger = logging.getLogger(__name__)

Overflow = Literal["stop", "truncate"]  # what an observation that does not fit does

MAX_TURNS = 4
"""The rollout's cap on model turns when none is set (``rollout.max_turns``): every player of an
episode under the rollout's rules (the runner, the rollout worker, the warm start's oracle)
defaults to it; an env's own turn limit is its ``default_max_turns``."""


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
    max_turns: int = MAX_TURNS
    on_overflow: Overflow = "stop"
    min_turn_tokens: int = 1
    env_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.on_overflow not in get_args(Overflow):
            raise ValueError(f"on_overflow must be one of {list(get_args(Overflow))}, got "
                             f"{self.on_overflow!r}")
        if self.max_turns < 1 or self.min_turn_tokens < 1:
            raise ValueError("max_turns and min_turn_tokens must be >= 1")
        if self.env_timeout_s is not None and not self.env_timeout_s > 0:
            raise ValueError(f"env_timeout_s must be > 0 or None, got {self.env_timeout_s}")


@dataclass
class TurnOutput:
    """The tokens of one model turn: ids, engine log-probs, which tokens were sampled and the
    weight version that sampled each (-1: not sampled, or not known)."""

    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    finish_reason: str = "stop"
    stop_reason: int | str | None = None
    versions: list[int] = field(default_factory=list)

    @classmethod
    def from_completion(cls, completion: Completion) -> TurnOutput:
        out = cls(finish_reason=completion.finish_reason, stop_reason=completion.stop_reason)
        out.extend(completion.token_ids, completion.log_probs, sampled=True,
                   versions=completion.versions)
        return out

    def extend(self, token_ids: Sequence[int], log_probs: Sequence[float] | None = None,
               sampled: bool = True, versions: Sequence[int] | None = None) -> None:
        """Add tokens: sampled ones need their log-probs (and may say the weight version that
        sampled each, `Completion.versions`); inserted ones get mask 0, log-prob 0."""
        ids = [int(t) for t in token_ids]
        if sampled:
            if log_probs is None or len(log_probs) != len(ids):
                raise ValueError("sampled tokens need one log-prob each (SamplingConfig.logprobs)")
            self.log_probs.extend(float(x) for x in log_probs)
        else:
            self.log_probs.extend([0.0] * len(ids))
        known = sampled and versions is not None and len(versions) == len(ids)
        self.versions.extend([int(v) for v in versions] if known else [-1] * len(ids))
        self.token_ids.extend(ids)
        self.mask.extend([int(sampled)] * len(ids))

    def add(self, completion: Completion) -> None:
        """Append another engine completion (e.g. the second stage of a turn)."""
        self.extend(completion.token_ids, completion.log_probs, sampled=True,
                    versions=completion.versions)
        self.finish_reason, self.stop_reason = completion.finish_reason, completion.stop_reason


@dataclass
class EpisodeState:
    """One running episode: its `Trajectory` under construction (``traj``) and the token
    stream so far; hooks read and extend it."""

    env: Any
    traj: Trajectory
    prompt_ids: list[int]
    max_response_len: int
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    start_version: int = 0  # the engine's weight version when the episode started
    final_info: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # per_turn: as at inference
    samples: list[TokenStream] = field(default_factory=list)  # per_turn: the closed samples
    next_prompt: bool = False  # per_turn: the next turn starts a new sample
    done: bool = False
    finish_reason: str | None = None
    error: str | None = None
    infra_failure: str | None = None

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def room(self) -> int:
        """Response tokens still allowed."""
        return self.max_response_len - len(self.response_ids)

    def append(self, token_ids: Sequence[int], log_probs: Sequence[float] | None = None,
               mask: Sequence[int] | None = None, versions: Sequence[int] | None = None
               ) -> tuple[int, int]:
        """Append response tokens; returns their [start, end) span in the response.
        ``versions``: the weight version that sampled each token; a sampled token without
        one (-1, or None for all) gets ``start_version``, the oldest it can have."""
        n = len(token_ids)
        mask = [0] * n if mask is None else list(mask)
        log_probs = [0.0] * n if log_probs is None else list(log_probs)
        versions = [-1] * n if versions is None else list(versions)
        if not (len(mask) == len(log_probs) == len(versions) == n):
            raise ValueError(f"{n} tokens, {len(mask)} mask values, {len(log_probs)} log-probs, "
                             f"{len(versions)} versions")
        if n > self.room:
            raise ValueError(f"{n} tokens do not fit the {self.room} left in the budget")
        start = len(self.response_ids)
        self.response_ids.extend(int(t) for t in token_ids)
        self.response_mask.extend(int(m) for m in mask)
        self.log_probs.extend(float(x) if m else 0.0 for x, m in zip(log_probs, mask,
                                                                    strict=True))
        self.versions.extend((int(v) if v >= 0 else self.start_version) if m else -1
                             for v, m in zip(versions, mask, strict=True))
        return start, len(self.response_ids)

    def end(self, reason: str, error: str | None = None, infra: str | None = None) -> None:
        """Mark the episode over (`EpisodeRunner.finish` closes the trajectory); ``infra``
        names an infrastructure failure (`toolrl.core.trajectory.INFRA_FAILURES`)."""
        self.done, self.finish_reason, self.error = True, reason, error
        self.infra_failure = infra


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
                  seed: int | None = None) -> Trajectory:
        """Play one episode of ``env`` from task ``row``."""
        t0 = time.perf_counter()
        state = await self.start(env, row, seed)
        while not state.done:
            await self.play_turn(state)
        traj = self.finish(state)
        traj.timing["total_s"] = time.perf_counter() - t0
        return traj

    async def start(self, env: Any, row: Mapping[str, Any] | None,
                    seed: int | None) -> EpisodeState:
        """Reset the env and render the first prompt."""
        row = dict(row or {})
        try:
            messages, info = await self.reset_env(env, row, seed)
            tools = list(info.get("tools") or [])
            prompt = self.renderer.render_prompt(messages, tools)
        except TimeoutError:
            return self.failed_state(env, row, seed, f"reset: the env did not answer within "
                                     f"env_timeout_s={self.config.env_timeout_s:g}",
                                     infra="env_timeout")
        except Exception as e:  # a bad row or template: this episode fails, the batch goes on
            return self.failed_state(env, row, seed, describe_exception(e, "reset"),
                                     infra="env_exception")
        limit = self.engine.max_model_len - len(prompt)
        budget = min(self.config.max_response_len or limit, limit)
        traj = Trajectory(messages=list(messages), row=row, tools=tools,
                          format=info.get("format"), seed=seed)
        state = EpisodeState(env, traj, prompt, max(budget, 0), history=list(messages),
                             start_version=int(getattr(self.engine, "weight_version", 0)))
        if len(prompt) > self.max_prompt_len:  # keep a (cut) prompt so the row is not empty
            state.prompt_ids, state.max_response_len = prompt[-self.max_prompt_len:], 0
            state.end("context", f"the prompt has {len(prompt)} tokens, more than "
                                 f"max_prompt_len={self.max_prompt_len}")
        return state

    async def reset_env(self, env: Any, row: Mapping[str, Any], seed: int | None
                        ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Give a `ToolEnv` its `env_model`, then reset it from ``row``. An env that declares
        ``blocking_step`` resets on a daemon thread (within ``env_timeout_s``), as it steps."""
        base = getattr(env, "unwrapped", env)
        if isinstance(base, ToolEnv):
            base.rollout_model = self.env_model(seed)
        if getattr(base, "blocking_step", False):
            return await asyncio.wait_for(in_daemon_thread(env.reset, seed=seed,
                                                           options=dict(row) or None),
                                          self.config.env_timeout_s)
        hold = Hold()
        try:
            return timed_call(env.reset, hold, seed=seed, options=dict(row) or None)
        finally:
            warn_if_held(base, "reset", hold)

    def env_model(self, seed: int | None) -> EngineChatModel:
        """The engine as the chat model of one episode's env (`ToolEnv.rollout_model`): the
        per-turn sampling by default, seeded from the episode's seed."""
        return EngineChatModel(self.engine, self.renderer, self.config.sampling, seed)

    def failed_state(self, env: Any, row: Mapping[str, Any], seed: int | None,
                     error: str, infra: str | None = None) -> EpisodeState:
        """A finished state for an episode that could not start (finish reason ``error``;
        ``infra``: the infrastructure failure behind it)."""
        logger.warning("episode %s failed to start: %s", row.get("id"), error)
        # one placeholder token keeps the batch row non-empty; its response is empty
        traj = Trajectory(messages=list(row.get("messages") or []), row=dict(row), seed=seed)
        state = EpisodeState(env, traj, [self.renderer.eos_token_id], 0)
        state.end("error", error, infra)
        return state

    def failed(self, row: Mapping[str, Any], seed: int | None, error: str,
               infra: str | None = "env_exception") -> Trajectory:
        """The trajectory of an episode that could not even get an env (or whose loop
        crashed: ``infra="agent_crash"``)."""
        return self.finish(self.failed_state(None, row, seed, error, infra))

    async def play_turn(self, state: EpisodeState) -> None:
        """Generate one model turn, step the env, append the observation."""
        traj = state.traj
        if len(traj.turns) >= self.config.max_turns:
            state.end("max_turns")
            return
        if state.next_prompt and not self.new_sample(state):
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
        span = state.append(out.token_ids, out.log_probs, out.mask,
                            out.versions if len(out.versions) == len(out.token_ids) else None)
        text = self.decode(state, out)
        traj.messages.append({"role": "assistant", "content": text})
        if out.finish_reason == "length" and state.room <= 0:
            # cut by the budget: nothing sensible to send the env
            traj.turns.append(self.unstepped_turn(state, text, span, out, gen_s))
            state.end("length")
            return
        t1 = time.perf_counter()
        limit = self.config.env_timeout_s
        try:
            observation, reward, terminated, truncated, info = \
                await self.bounded_step(state, text, limit)
        except TimeoutError:
            logger.warning("env step timed out in episode %s after %s s", traj.id, limit)
            traj.turns.append(self.unstepped_turn(state, text, span, out, gen_s))
            state.end("error", f"step: the env did not answer within env_timeout_s={limit:g}",
                      infra="env_timeout")
            return
        except Exception as e:
            logger.warning("env step failed in episode %s: %s", traj.id, e)
            traj.turns.append(self.unstepped_turn(state, text, span, out, gen_s))
            state.end("error", describe_exception(e, "step"), infra="env_exception")
            return
        turn = TurnRecord.from_step(text, float(reward), info, parser=self.parser(state))
        turn.action_span, turn.finish_reason = span, out.finish_reason
        turn.generate_s, turn.env_s = gen_s, time.perf_counter() - t1
        traj.turns.append(turn)
        traj.messages.extend(observation)
        if terminated or truncated:
            state.final_info = dict(info)
            state.end("terminated" if terminated else "truncated")
            return
        ended_with_eos = out.token_ids[-1] == self.renderer.eos_token_id
        await self.observe(state, observation, ended_with_eos)

    def unstepped_turn(self, state: EpisodeState, text: str, span: tuple[int, int],
                       out: TurnOutput, gen_s: float) -> TurnRecord:
        """The record of a turn the env never ran: parsed here, once, with the env's
        format (rewards read every turn's parse)."""
        return TurnRecord(action=text, parse=self.parser(state).parse(text), action_span=span,
                          finish_reason=out.finish_reason, generate_s=gen_s)

    @staticmethod
    def parser(state: EpisodeState) -> Any:
        """The env's tool-call format (its ``parser``), else the one its reset named."""
        env = getattr(state.env, "unwrapped", state.env)
        parser = getattr(env, "parser", None)
        return parser if parser is not None else get_format(state.traj.format or "hermes")

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
        seed = state.traj.seed
        if seed is not None:
            position = len(state.response_ids) + offset
            changes.setdefault("seed", (seed * 1_000_003 + 7919 * len(state.traj.turns)
                                        + position) % (2**31 - 1))
        return base.replace(**changes)

    def decode(self, state: EpisodeState, turn: TurnOutput) -> str:
        """The assistant message text the env receives."""
        return self.renderer.decode(turn.token_ids)

    async def bounded_step(self, state: EpisodeState, text: str, limit: float | None
                           ) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        """`step_env` within ``limit`` seconds (None: no limit), else `TimeoutError`.

        An env that declares ``blocking_step`` (its step runs blocking code: sync evaluation,
        inline tools, calls of `ToolEnv.rollout_model`) steps on a daemon thread through its
        sync ``step`` (with or without a limit), so it never blocks this loop and the wait
        ends at the limit however long the code blocks (the thread is abandoned with the
        env). Any other env steps on this event loop: a stretch of its step that holds the
        loop past `loop_hold.HOLD_WARN_S` is named in one warning, and a step that blocked the
        loop past the limit (so no timer could fire) is timed out all the same when it
        returns.
        """
        if getattr(state.env.unwrapped, "blocking_step", False):
            return await asyncio.wait_for(in_daemon_thread(state.env.step, text), limit)
        hold = Hold()  # the longest stretch the step runs without an await (loop_hold.py)
        try:
            if limit is None:
                return await held(self.step_env(state, text), hold)
            start = time.monotonic()
            out = await asyncio.wait_for(run_coroutine(self.step_env(state, text), hold), limit)
        finally:
            warn_if_held(state.env.unwrapped, "step", hold)
        if time.monotonic() - start > limit:
            logger.warning("an env step of %s blocked the event loop past env_timeout_s=%g s: "
                           "set blocking_step = True on the env class so the timeout can stop "
                           "it", type(state.env.unwrapped).__name__, limit)
            raise TimeoutError
        return out

    async def step_env(self, state: EpisodeState, text: str
                       ) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        """``await env.astep(text)`` through any wrappers."""
        return await resolve_astep(state.env)(text)

    async def observe(self, state: EpisodeState, observation: Sequence[Mapping[str, Any]],
                      ended_with_eos: bool) -> None:
        """Append the observation delta (mask 0) if it fits; otherwise end with ``context``.
        ``per_turn``: record the turn and the observation in the history instead; the next
        turn starts a sample of its own (`new_sample`)."""
        if self.renderer.per_turn:
            turn = state.traj.turns[-1]
            state.history.append(self.renderer.inference_message(turn.action, turn.parse))
            state.history.extend(dict(m) for m in observation)
            state.next_prompt = True
            return
        try:
            delta = self.renderer.render_delta(observation, state.traj.tools,
                                               after_eos=ended_with_eos)
        except TemplateError as e:
            state.end("error", f"template: {e}")
            return
        except Exception as e:  # e.g. text the tokenizer rejects: this episode ends, not the batch
            state.end("error", f"observation: {type(e).__name__}: {e}")
            return
        turn = state.traj.turns[-1]
        if len(delta) + self.config.min_turn_tokens > state.room:
            if self.config.on_overflow == "truncate" and state.room > 0:
                turn.observation_span = state.append(delta[: state.room])
            state.end("context")
            return
        turn.observation_span = state.append(delta)

    def new_sample(self, state: EpisodeState) -> bool:
        """``per_turn``: close the current sample and start the next one, prompted with the
        template's rendering of the history; False (the episode ended) when it cannot be
        rendered or does not fit."""
        state.next_prompt = False
        try:
            prompt = self.renderer.render_prompt(state.history, state.traj.tools)
        except Exception as e:  # a template that fails on this history: this episode ends
            state.end("error", f"template: {e}")
            return False
        limit = self.engine.max_model_len - len(prompt)
        if len(prompt) > self.max_prompt_len or limit < self.config.min_turn_tokens:
            state.end("context", f"per_turn: the prompt of turn {len(state.traj.turns) + 1} "
                                 f"has {len(prompt)} tokens, more than max_prompt_len="
                                 f"{self.max_prompt_len}")
            return False
        state.samples.append(TokenStream(list(state.prompt_ids), list(state.response_ids),
                                         list(state.response_mask), list(state.log_probs),
                                         list(state.versions)))
        state.prompt_ids, state.response_ids = prompt, []
        state.response_mask, state.log_probs, state.versions = [], [], []
        state.max_response_len = min(self.config.max_response_len or limit, limit)
        return True

    def finish(self, state: EpisodeState) -> Trajectory:
        """Close the trajectory: finish reason, outcome, final state, tokens, timing."""
        snapshot: dict[str, Any] = {}
        if state.env is not None:
            try:
                getter = getattr(state.env, "state_snapshot", None) or \
                    state.env.unwrapped.state_snapshot
                snapshot = plain(getter())
            except Exception as e:
                logger.warning("state_snapshot failed: %s", e)
        traj = state.traj
        traj.infra_failure = state.infra_failure
        traj.finish(state.finish_reason or "error", state.final_info, snapshot, state.error)
        traj.messages = plain(traj.messages)
        traj.timing = {"generate_s": sum(t.generate_s for t in traj.turns),
                       "env_s": sum(t.env_s for t in traj.turns)}
        traj.tokens = TokenStream(list(state.prompt_ids), list(state.response_ids),
                                  list(state.response_mask), list(state.log_probs),
                                  list(state.versions))
        streams = [*state.samples, traj.tokens]
        traj.prompt_tokens = sum(len(t.prompt_ids) for t in streams)
        traj.response_tokens = sum(len(t.response_ids) for t in streams)
        traj.sampled_tokens = int(sum(sum(t.response_mask) for t in streams))
        if self.renderer.per_turn:
            traj.extra["per_turn"] = {"samples": len(streams),
                                      "turn_sample": list(range(len(traj.turns))),
                                      "streams": [t.to_dict() for t in state.samples]}
        return traj


__all__ = [
    "EpisodeConfig",
    "EpisodeRunner",
    "EpisodeState",
    "TurnOutput",
]
