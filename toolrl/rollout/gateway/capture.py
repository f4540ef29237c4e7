"""Token capture of one agent episode, and its merge into training samples.

Every call on an episode's route (Chat Completions, Responses or Messages: each is translated
into chat messages first) becomes a `CallRecord`: the prompt ids the
gateway rendered, the ids the engine sampled with their log-probs, and the reply it sent. The
prompt of a call is built the way the env path builds its next turn (`EpisodeCapture.prompt_for`):

- when the call's messages are the previous call's messages, then the reply the gateway gave,
  then new messages (tool results, a user turn), the prompt is the previous prompt and
  completion followed by the template delta of the new messages (`ChatRenderer.render_delta`):
  no re-tokenization, so the sampled tokens stay exactly as sampled;
- otherwise (the agent rewrote, trimmed or summarized its history, or changed the tools, or
  the template rewrites history: the ``per_turn`` policy) the whole conversation is rendered
  afresh (`ChatRenderer.render_prompt`).

`EpisodeCapture.samples` merges the calls into training samples: a run of calls that each
extend the previous one is one sample (mask 1 exactly on sampled tokens, the deltas between
calls mask 0, as in the env path); a call that does not extend starts a new sample. ``splits``
counts the new starts after the first.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl.core.tools import parse_error_records
from toolrl.core.trajectory import TokenStream, ToolOutput, Trajectory, TurnRecord
from toolrl.core.types import ParseResult

__all__ = ["CallRecord", "EpisodeCapture", "Sample", "canonical", "template_messages"]


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages as the chat template takes them: text parts joined, ``developer``
    as ``system``, tool-call arguments decoded from their JSON string."""
    out = []
    for m in messages:
        role = "system" if m.get("role") == "developer" else m.get("role")
        msg: dict[str, Any] = {"role": role, "content": content_text(m.get("content"))}
        if m.get("tool_calls"):
            msg["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    return out


def content_text(content: Any) -> str:
    """A message's content as text: a string, or the text of its ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def _template_call(call: Mapping[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        with contextlib.suppress(ValueError):  # else kept as the model wrote it
            args = json.loads(args)
    return {"id": call.get("id"), "type": "function",
            "function": {"name": fn.get("name"), "arguments": args}}


def canonical(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a message renders to (role, text, calls, name, tool call id), for comparing the
    history an agent sends with the one the gateway saw; call ids and extra keys an SDK adds
    (``refusal``, ``annotations``) do not count."""
    calls = tuple((c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
                  for c in message.get("tool_calls") or ())
    return (message.get("role"), message.get("content") or "", calls, message.get("name"),
            message.get("tool_call_id"))


@dataclass
class CallRecord:
    """One chat-completions call of an episode.

    Attributes:
        messages / tools: the request's conversation (template form, `template_messages`).
        prompt_ids: the prompt the engine got; completion_ids / log_probs: what it sampled.
        reply: the assistant message returned (template form).
        text: the decoded completion; parse: the configured format's parse of it.
        finish_reason: the engine's (stop | length | abort).
        extends: the prompt is the previous call's prompt + completion + a delta.
        generate_s: seconds in the engine.
        versions: the weight version that sampled each completion token (empty: unknown).
        constrained: sampled through a grammar (``tool_choice`` required or named).
        api: the API that carried it (``chat.completions``, ``responses``, ``messages``).
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    prompt_ids: list[int]
    completion_ids: list[int]
    log_probs: list[float]
    reply: dict[str, Any]
    text: str
    parse: ParseResult
    finish_reason: str
    extends: bool
    generate_s: float = 0.0
    versions: list[int] = field(default_factory=list)
    constrained: bool = False
    api: str = "chat.completions"


@dataclass
class Sample:
    """One training sample: a prompt, then a response of sampled tokens (mask 1) and deltas
    between calls (mask 0); ``calls`` are the indices of the calls it holds, ``spans`` each
    call's [start, end) in the response, ``deltas`` the delta before each call after the
    first."""

    tokens: TokenStream
    calls: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    deltas: list[tuple[int, int]] = field(default_factory=list)


class EpisodeCapture:
    """The calls of one episode (see the module docstring).

    ``seed``, ``temperature``, ``top_p`` and ``top_k`` (None: the request's; top_k: off)
    are the route's sampling:
    a training route samples at the rollout's temperature whatever the agent asks, since the
    update scores the tokens at that temperature; ``seed`` seeds each call (``seed`` and the
    call's index) that does not bring its own. ``overflow``: a call was refused with
    ``context_length_exceeded`` (the conversation outgrew the token budget).
    ``conversations``: what the Responses API's ``previous_response_id`` continues (a
    response's id: its chat messages, the reply last), kept until the episode closes.
    """

    def __init__(self, episode_id: str, *, seed: int | None = None,
                 temperature: float | None = None, top_p: float | None = None,
                 top_k: int = -1) -> None:
        self.id = episode_id
        self.seed, self.temperature, self.top_p, self.top_k = seed, temperature, top_p, top_k
        self.calls: list[CallRecord] = []
        self.overflow = False  # a call was refused: the conversation outgrew the budget
        self.conversations: dict[str, list[dict[str, Any]]] = {}

    def sample_prompt_len(self) -> int:
        """Prompt length of the sample the last call belongs to (0 before any call)."""
        for c in reversed(self.calls):
            if not c.extends:
                return len(c.prompt_ids)
        return 0

    def prompt_for(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                   renderer: Any) -> tuple[list[int], bool]:
        """(prompt ids, whether they extend the previous call) for a call's conversation."""
        prev = self.calls[-1] if self.calls else None
        per_turn = getattr(renderer, "per_turn", False)  # every call its own sample
        if prev is not None and prev.completion_ids and not per_turn and \
                self.extends(prev, messages, tools):
            new = messages[len(prev.messages) + 1:]
            ended_with_eos = prev.completion_ids[-1] == renderer.eos_token_id
            delta = renderer.render_delta(new, tools or None, after_eos=ended_with_eos)
            return prev.prompt_ids + prev.completion_ids + delta, True
        return renderer.render_prompt(messages, tools or None), False

    @staticmethod
    def extends(prev: CallRecord, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]]) -> bool:
        """The conversation is ``prev``'s, then its reply, then (optionally) new messages."""
        seen = [*prev.messages, prev.reply]
        if len(messages) < len(seen) or list(tools) != list(prev.tools):
            return False
        return all(canonical(a) == canonical(b) for a, b in zip(seen, messages, strict=False))

    @property
    def splits(self) -> int:
        """Calls after the first that started a new sample (a rewritten history)."""
        return sum(1 for c in self.calls[1:] if not c.extends)

    def samples(self) -> list[Sample]:
        """The calls merged into training samples, in order."""
        out: list[Sample] = []
        for i, call in enumerate(self.calls):
            if not call.extends or not out:
                out.append(Sample(TokenStream(prompt_ids=list(call.prompt_ids))))
            else:
                s = out[-1].tokens
                before = len(s.prompt_ids) + len(s.response_ids)
                delta = call.prompt_ids[before:]
                start = len(s.response_ids)
                s.response_ids += delta
                s.response_mask += [0] * len(delta)
                s.log_probs += [0.0] * len(delta)
                s.versions += [-1] * len(delta)
                out[-1].deltas.append((start, len(s.response_ids)))
            sample = out[-1]
            s = sample.tokens
            start = len(s.response_ids)
            s.response_ids += call.completion_ids
            s.response_mask += [1] * len(call.completion_ids)
            s.log_probs += list(call.log_probs)
            s.versions += list(call.versions) if len(call.versions) == \
                len(call.completion_ids) else [-1] * len(call.completion_ids)
            sample.calls.append(i)
            sample.spans.append((start, len(s.response_ids)))
        return out

    def trajectory(self, row: Mapping[str, Any], *, format: str | None,
                   info: Mapping[str, Any] | None = None, finish_reason: str = "terminated",
                   error: str | None = None, infra: str | None = None
                   ) -> tuple[Trajectory, list[Sample]]:
        """The episode's `Trajectory` (one turn per call) and its samples.

        ``traj.tokens`` is the last sample; each turn's spans index its own sample
        (``traj.extra["gateway"]["turn_sample"]`` says which), the tool results are the tool
        messages the agent sent after the call. ``info`` (what the agent returned) gives
        ``success``.
        """
        samples = self.samples()
        turn_sample: list[int] = [0] * len(self.calls)
        for k, sample in enumerate(samples):
            for i in sample.calls:
                turn_sample[i] = k
        turns = []
        for i, call in enumerate(self.calls):
            turn = TurnRecord(action=call.text, parse=call.parse,
                              finish_reason=call.finish_reason, generate_s=call.generate_s,
                              errors=parse_error_records(call.parse))
            sample = samples[turn_sample[i]]
            j = sample.calls.index(i)
            turn.action_span = sample.spans[j]
            if j + 1 < len(sample.calls):
                turn.observation_span = sample.deltas[j]
            if i + 1 < len(self.calls) and self.calls[i + 1].extends:
                after = self.calls[i + 1].messages[len(call.messages):]
                turn.results = _tool_results(after[0], after[1:])
            turns.append(turn)
        last = self.calls[-1] if self.calls else None
        messages = [*last.messages, last.reply] if last else []
        traj = Trajectory(messages=messages, turns=turns, row=dict(row),
                          tools=list(last.tools) if last else [], format=format,
                          infra_failure=infra)
        traj.finish(finish_reason, info, None, error)
        if samples:
            traj.tokens = samples[-1].tokens
            traj.prompt_tokens = sum(len(s.tokens.prompt_ids) for s in samples)
            traj.response_tokens = sum(len(s.tokens.response_ids) for s in samples)
            traj.sampled_tokens = sum(sum(s.tokens.response_mask) for s in samples)
        traj.timing = {"generate_s": sum(c.generate_s for c in self.calls)}
        traj.extra["gateway"] = {"calls": len(self.calls), "samples": len(samples),
                                 "splits": self.splits, "turn_sample": turn_sample,
                                 "constrained": sum(c.constrained for c in self.calls),
                                 "apis": [c.api for c in self.calls]}
        return traj, samples


def _tool_results(reply: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]
                  ) -> list[ToolOutput]:
    """The tool messages an agent sent after ``reply`` (the assistant message of the call),
    each named by its function: the message's own ``name``, else the call of ``reply`` its
    ``tool_call_id`` answers (the OpenAI SDKs send no name), else the id itself."""
    by_id = {c.get("id"): (c.get("function") or {}).get("name")
             for c in reply.get("tool_calls") or ()}
    return [ToolOutput(name=str(m.get("name") or by_id.get(m.get("tool_call_id"))
                                or m.get("tool_call_id") or ""),
                       content=m.get("content") or "")
            for m in messages if m.get("role") == "tool"]
