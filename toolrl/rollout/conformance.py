"""Does a rollout train on exactly what the model sees at inference? Checked on conversations.

`episode_mismatches` replays one conversation the way the rollout holds it under the
renderer's history policy and counts the tokens that differ from the template's own rendering
at inference:

- ``delta`` / ``keep_stream``: the first prompt, each model turn's tokens (what the template
  renders for that turn: what a model that follows it samples), the delta after it; against
  one full rendering of the conversation. Every position that differs counts, and so does a
  difference in length.
- ``per_turn``: for every model turn, its prompt as the rollout builds it (earlier turns
  rebuilt from the sampled text: parsed with the family's format, reasoning split off,
  `ChatRenderer.inference_message`) against the template's rendering of the true history
  (the conversation's own messages), token by token.

`random_episode` draws the conversations of the conformance matrix (parallel calls, tool
errors, long tool outputs, reasoning on and off, follow-up user turns); `template_report`
is what ``toolrl check-template`` prints for one tokenizer.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl.core.families import template_sha256
from toolrl.core.parse import get_format
from toolrl.core.types import ToolCall
from toolrl.rollout.chat import ChatRenderer, TemplateError, drops_tools, tool_coverage

__all__ = ["CHECK_EPISODE", "CHECK_TOOLS", "EpisodeCheck", "episode_mismatches",
           "random_episode", "sampled_text", "template_report"]

_WORDS = ("the a of to in is what how many find sum total city weather account amount order "
          "price item please then next done sure here result error value list file user id "
          "name date time code limit").split()


def _tool(name: str, desc: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": required}}}


CHECK_TOOLS: list[dict[str, Any]] = [
    _tool("add", "Add two numbers.", {"a": {"type": "number"}, "b": {"type": "number"}},
          ["a", "b"]),
    _tool("get_weather", "Weather of a city.", {"city": {"type": "string"}, "unit": {
        "type": "string", "enum": ["c", "f"]}}, ["city"]),
    _tool("search", "Search the web.", {"query": {"type": "string"}, "limit": {
        "type": "integer"}}, ["query"]),
]


def _call(name: str, args: dict[str, Any], i: int) -> dict[str, Any]:
    return {"id": f"call{i:05d}", "type": "function",
            "function": {"name": name, "arguments": args}}


# six model turns: parallel calls, a tool error, a long output, reasoning, a final answer
CHECK_EPISODE: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant with tools."},
    {"role": "user", "content": "Weather in Paris and Rome, then add 2 and 3."},
    {"role": "assistant", "content": "<think>\nTwo cities: two calls.\n</think>\n\n",
     "tool_calls": [_call("get_weather", {"city": "Paris"}, 0),
                    _call("get_weather", {"city": "Rome", "unit": "c"}, 1)]},
    {"role": "tool", "tool_call_id": "call00000", "name": "get_weather", "content": "18 C, sunny"},
    {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "21 C"},
    {"role": "assistant", "content": "", "tool_calls": [_call("add", {"a": 2, "b": "3"}, 2)]},
    {"role": "tool", "tool_call_id": "call00002", "name": "add", "content": json.dumps(
        {"error": "invalid_argument", "message": "b must be a number"})},
    {"role": "assistant", "content": "<think>\nb must be a number.\n</think>\n\n",
     "tool_calls": [_call("add", {"a": 2, "b": 3}, 3)]},
    {"role": "tool", "tool_call_id": "call00003", "name": "add", "content": "5"},
    {"role": "assistant", "content": "", "tool_calls": [_call(
        "search", {"query": "weather history Paris", "limit": 3}, 4)]},
    {"role": "tool", "tool_call_id": "call00004", "name": "search",
     "content": " ".join(f"result {i}: Paris had {10 + i % 20} C on day {i}." for i in range(60))},
    {"role": "assistant", "content": "<think>\nAll there.\n</think>\n\nParis 18 C, Rome 21 C; "
                                     "2 + 3 = 5."},
    {"role": "user", "content": "Thanks. Anything else?"},
    {"role": "assistant", "content": "No, that is all."},
]


def _words(rng: random.Random, k: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(k))


def _args(rng: random.Random, tool: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    params = tool["function"]["parameters"]
    for name, prop in params["properties"].items():
        if name not in params["required"] and rng.random() < 0.5:
            continue
        if "enum" in prop:
            out[name] = rng.choice(prop["enum"])
        elif prop["type"] in ("number", "integer"):
            out[name] = rng.choice([rng.randint(-999, 9999), round(rng.uniform(0, 99), 2)]) \
                if prop["type"] == "number" else rng.randint(0, 50)
        else:
            out[name] = _words(rng, rng.randint(1, 4))
    return out


def random_episode(rng: random.Random, thinking: bool) -> list[dict[str, Any]]:
    """A conversation of 1-5 model turns with 1-3 calls each (several: parallel calls), tool
    results that are sometimes errors or long (up to ~3,000 characters), sometimes a
    follow-up user turn, and a final answer; reasoning before each turn when ``thinking``."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.7:
        messages.append({"role": "system", "content": _words(rng, rng.randint(3, 12)) + "."})
    messages.append({"role": "user", "content": _words(rng, rng.randint(3, 15)) + "?"})
    n = 0
    for _ in range(rng.randint(1, 5)):
        think = f"<think>\n{_words(rng, rng.randint(2, 20))}\n</think>\n\n" if thinking else ""
        calls = [_call(t["function"]["name"], _args(rng, t), n + j)
                 for j, t in enumerate(rng.choices(CHECK_TOOLS, k=rng.randint(1, 3)))]
        n += len(calls)
        messages.append({"role": "assistant", "content": think, "tool_calls": calls})
        for c in calls:
            kind = rng.random()
            if kind < 0.2:
                out = json.dumps({"error": rng.choice(["invalid_argument", "timeout"]),
                                  "message": _words(rng, 6)})
            elif kind < 0.35:
                out = " ".join(_words(rng, 10) for _ in range(rng.randint(10, 40)))
            else:
                out = str(rng.randint(-999, 99999)) if rng.random() < 0.5 else _words(rng, 5)
            messages.append({"role": "tool", "tool_call_id": c["id"],
                             "name": c["function"]["name"], "content": out})
        if rng.random() < 0.2:
            think = f"<think>\n{_words(rng, 5)}\n</think>\n\n" if thinking else ""
            messages.append({"role": "assistant", "content": think + _words(rng, 8) + "."})
            messages.append({"role": "user", "content": _words(rng, 6) + "?"})
    think = f"<think>\n{_words(rng, rng.randint(2, 10))}\n</think>\n\n" if thinking else ""
    messages.append({"role": "assistant", "content": think + "The answer is "
                     + str(rng.randint(0, 9999)) + "."})
    return messages


def sampled_text(renderer: ChatRenderer, message: Mapping[str, Any]) -> str:
    """What a model of the renderer's family writes for ``message`` (before its turn's end):
    its text (reasoning included), then its calls in the family's format."""
    fmt = get_format(renderer.family.tool_format if renderer.family else "hermes")
    calls = [ToolCall(c["function"]["name"], c["function"]["arguments"], id=c.get("id"))
             for c in message.get("tool_calls") or ()]
    return fmt.render(calls, message.get("content") or "")


@dataclass
class EpisodeCheck:
    """One conversation's replay: tokens compared, tokens that differ, the turns whose calls
    did not survive render -> parse, and where the first difference is."""

    compared: int = 0
    mismatched: int = 0
    round_trip_failures: int = 0
    first: str = ""
    turns: int = 0
    samples: list[int] = field(default_factory=list)


def _diff(a: Sequence[int], b: Sequence[int]) -> tuple[int, int | None]:
    bad = sum(1 for x, y in zip(a, b, strict=False) if x != y) + abs(len(a) - len(b))
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                 None if len(a) == len(b) else min(len(a), len(b)))
    return bad, first


def episode_mismatches(renderer: ChatRenderer, messages: Sequence[Mapping[str, Any]],
                       tools: Sequence[Mapping[str, Any]] | None) -> EpisodeCheck:
    """Replay ``messages`` under the renderer's policy (see the module docstring)."""
    messages = [dict(m) for m in messages]
    out = EpisodeCheck()
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    out.turns = len(turns)
    fmt = get_format(renderer.family.tool_format if renderer.family else "hermes")
    if not renderer.per_turn:
        ids = renderer.render_prompt(messages[: turns[0]], tools)
        for k, i in enumerate(turns):
            try:  # what a model that follows the template samples
                sampled = renderer.assistant_tokens(messages[:i], messages[i], tools)
            except TemplateError:  # the template renders no turn as sampled: the format's
                sampled = [*renderer.encode(sampled_text(renderer, messages[i])),
                           renderer.eos_token_id]
            calls = [(c["function"]["name"], c["function"]["arguments"])
                     for c in messages[i].get("tool_calls") or ()]
            parsed = fmt.parse(renderer.decode(sampled))
            if [(c.name, c.arguments) for c in parsed.calls] != calls:
                out.round_trip_failures += 1
            ids += sampled
            end = turns[k + 1] if k + 1 < len(turns) else len(messages)
            more = k + 1 < len(turns) or end > i + 1
            ids += renderer.render_delta(messages[i + 1: end], tools, after_eos=True,
                                         add_generation_prompt=more)
        full = renderer.encode(renderer.render_text(messages, tools))
        out.compared, out.samples = len(full), [len(ids)]
        out.mismatched, first = _diff(ids, full)
        if first is not None:
            out.first = (f"token {first}: {renderer.tokenizer.decode(ids[first:first + 8])!r} "
                         f"vs {renderer.tokenizer.decode(full[first:first + 8])!r}")
        return out
    history: list[dict[str, Any]] = messages[: turns[0]]
    truth = _server_form(renderer, messages)
    for k, i in enumerate(turns):
        want = renderer.encode(renderer.render_text(truth[:i], tools,
                                                    add_generation_prompt=True))
        got = renderer.render_prompt(history, tools)
        out.compared += len(want)
        out.samples.append(len(got))
        bad, first = _diff(got, want)
        out.mismatched += bad
        if first is not None and not out.first:
            out.first = (f"turn {k + 1}, token {first}: "
                         f"{renderer.tokenizer.decode(got[first:first + 8])!r} vs "
                         f"{renderer.tokenizer.decode(want[first:first + 8])!r}")
        text = sampled_text(renderer, messages[i])
        parse = fmt.parse(text)
        calls = [(c["function"]["name"], c["function"]["arguments"])
                 for c in messages[i].get("tool_calls") or ()]
        if [(c.name, c.arguments) for c in parse.calls] != calls:
            out.round_trip_failures += 1
        end = turns[k + 1] if k + 1 < len(turns) else len(messages)
        history += [renderer.inference_message(text, parse),
                    *(dict(m) for m in messages[i + 1: end])]
    return out


def _server_form(renderer: ChatRenderer, messages: Sequence[Mapping[str, Any]]
                 ) -> list[dict[str, Any]]:
    """The conversation as a client sends it back to an OpenAI-compatible server: a family
    that reasons gets its reasoning split off into ``reasoning_content`` (a reasoning parser's
    work), as the rollout's `ChatRenderer.inference_message` does."""
    thinking = renderer.family.thinking if renderer.family is not None else None
    out = []
    for m in messages:
        m = dict(m)
        if thinking is not None and m.get("role") == "assistant":
            reasoning, content = thinking.split(m.get("content") or "")
            m["content"] = content
            if reasoning is not None:
                m["reasoning_content"] = reasoning
        out.append(m)
    return out


def template_report(renderer: ChatRenderer, messages: Sequence[Mapping[str, Any]] | None = None,
                    tools: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """The lines of ``toolrl check-template``: family, prefix preservation (and where it
    breaks), tools and the schema parts left out, the round trip of one and several calls,
    thinking, the history policy, and the token equality on a 6-turn episode."""
    messages = list(messages or CHECK_EPISODE)
    tools = list(tools or CHECK_TOOLS)
    fam = renderer.family
    lines = [f"family: {fam.name} ({fam.title})" if fam else
             "family: none known (no conventions; calls parsed as hermes)",
             f"template sha256: {template_sha256(renderer.tokenizer.chat_template)}"]
    report = renderer.conformance or renderer.check_prefix_preserving(messages, tools)
    lines.append("prefix-preserving: yes" if report.ok else
                 f"prefix-preserving: no ({report.first_break or report.describe()})")
    try:
        dropped = drops_tools(renderer)
        coverage = tool_coverage(renderer)
        how = " (written into the system prompt by toolrl: the template drops them)" if \
            fam is not None and fam.tools_in_system else ""
        lines.append(f"tools rendered: {'no' if dropped else 'yes'}{how}; schema parts left "
                     f"out: {', '.join(coverage.missing) or 'none'}")
    except TemplateError as exc:
        lines.append(f"tools: not checked ({exc})")
    fmt = get_format(fam.tool_format if fam else "hermes")
    for label, calls in (("one call", messages[5]["tool_calls"]),
                         ("several calls", messages[2]["tool_calls"])):
        msg = {"role": "assistant", "content": "", "tool_calls": calls}
        try:
            ids = renderer.assistant_tokens(messages[:2], msg, tools)
            text = renderer.decode(ids)
            parsed = fmt.parse(text)
            want = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
            ok = [(c.name, c.arguments) for c in parsed.calls] == want
            own = fmt.render([ToolCall(*w) for w in want])
            same = own.strip() in text
            lines.append(f"round trip, {label} ({fmt.name}): template renders -> parse "
                         f"{'equal' if ok else 'DIFFERENT: ' + repr(text[:160])}; the "
                         f"format's own rendering {'is' if same else 'is not'} the template's")
        except TemplateError as exc:
            lines.append(f"round trip, {label}: the template fails ({exc})")
    probe = [messages[1], {"role": "assistant", "content": "<think>\nPROBE_REASONING\n</think>"
                                                           "\n\nok"},
             {"role": "user", "content": "again"}]
    kept = "PROBE_REASONING" in renderer.render_text(probe, tools)
    if fam is not None and fam.thinking is not None:
        lines.append(f"thinking: {fam.thinking.open}...{fam.thinking.close}; earlier reasoning "
                     f"{'kept' if kept else 'dropped'} by the template"
                     + (f"; keep it with {dict(fam.thinking.preserve_kwargs)}"
                        if fam.thinking.preserve_kwargs else "; no keyword keeps it"))
    else:
        lines.append(f"thinking: no convention; a <think> block in earlier turns is "
                     f"{'kept as text' if kept else 'DROPPED'} by the template")
    if renderer.history is not None:
        lines.append(renderer.history.line())
    check = episode_mismatches(renderer, messages, tools)
    what = "per-turn prompts" if renderer.per_turn else "delta-appended stream"
    lines.append(f"6-turn episode (parallel calls, a tool error, a long output, a final answer):"
                 f" {what} vs the template's own rendering: {check.mismatched} of "
                 f"{check.compared} tokens differ" + (f" (first at {check.first})"
                                                      if check.first else ""))
    return lines
