"""Chat templates for token-in/token-out rollouts: the first prompt, then only deltas.

A multi-turn episode keeps the exact token ids the model sampled. After each model turn only
the tokens of the new messages (tool results or a user turn) and the next generation prompt are
appended; earlier turns are never re-tokenized. `ChatRenderer` computes those delta tokens
from the template itself: it renders a fixed dummy conversation with and without the new
messages and keeps the suffix, starting right after the eos that closed the model's turn (or
at the template's closing of the assistant turn when the model stopped without eos).

That is only equal to rendering the whole conversation again when the template is
prefix-preserving: rendering a message must not depend on the messages after it. Templates
that drop earlier reasoning blocks (e.g. ``<think>`` of past turns) are not. `ChatRenderer`
checks this once per template on a probe conversation (`check_prefix_preserving`, which also
names the first message whose arrival rewrites the rendering before it) and picks a history
policy (`toolrl.rollout.history`): deltas for a prefix-preserving template, else one sample
per model turn prompted with the template's own rendering (``per_turn``), or what the caller
asks for. `ChatRenderer.history` holds the decision and its one-line reason.

A template of a known family (`toolrl.core.families`, found by the template's sha256 or
named) gets its conventions: the token that ends a turn, ``tools`` written into the system
prompt when the template drops them, call arguments as a JSON string and no text beside
calls where the template needs it. `ChatRenderer.inference_message` turns a sampled turn into
the assistant message an OpenAI-compatible server would hand back (calls parsed, reasoning
split off), which ``per_turn`` prompts are rendered from.

`drops_tools` says whether a template ignores ``tools`` altogether (a prompt renders the same
with and without them: the model would never see its tools); check-env, the dry run and the
training pre-flight refuse such a template in one line. `tool_coverage` reports which parts
of a tool schema (descriptions, enums, defaults, nested properties...) a template leaves out of
the prompt: the model cannot use what it never sees.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolrl.core.families import Family, family_for_template, get_family
from toolrl.core.parse import get_format
from toolrl.core.types import ParseResult, ToolCall
from toolrl.rollout.history import HistoryDecision, HistoryPolicyError, decide

logger = logging.getLogger(__name__)

Message = Mapping[str, Any]
Tools = Sequence[Mapping[str, Any]] | None

PROMPT_CACHE_SIZE = 256  # first prompts remembered by `ChatRenderer.render_prompt`
_MARK = "\u2060TOOLRL_ASSISTANT_CONTENT\u2060"  # a marker that never occurs in real content

PROBE_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object",
                       "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                       "required": ["a", "b"]}}}
    for name, desc in (("add", "Add two numbers."), ("mul", "Multiply two numbers."))
]


def _call(name: str, a: int, b: int, i: int) -> dict[str, Any]:
    return {"id": f"call{i:05d}", "type": "function",
            "function": {"name": name, "arguments": {"a": a, "b": b}}}


# Several tool turns with reasoning blocks, then a new user turn: templates that rewrite or
# drop earlier turns (reasoning, tool-call formatting) show up as a mismatch.
PROBE_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a careful calculator."},
    {"role": "user", "content": "What is 2 plus 3, then times 4?"},
    {"role": "assistant", "content": "<think>Add first.</think>",
     "tool_calls": [_call("add", 2, 3, 0)]},
    {"role": "tool", "name": "add", "tool_call_id": "call00000", "content": "5"},
    {"role": "assistant", "content": "<think>Now multiply.</think>",
     "tool_calls": [_call("mul", 5, 4, 1)]},
    {"role": "tool", "name": "mul", "tool_call_id": "call00001", "content": "20"},
    {"role": "user", "content": "Thanks. And the final answer?"},
    {"role": "assistant", "content": "<think>Done.</think>The answer is 20."},
]


class TemplateError(ValueError):
    """A chat template cannot be used for delta-appending (or failed to render)."""


class RenderError(TemplateError):
    """The chat template raised while rendering (a broken template, not a history rewrite)."""


@dataclass(frozen=True)
class ConformanceReport:
    """Result of comparing delta-appended tokens with a full re-render of one conversation."""

    ok: bool
    incremental_len: int
    full_len: int
    first_mismatch: int | None = None
    incremental_context: str = ""
    full_context: str = ""
    reason: str = ""
    first_break: str = ""  # the first message whose arrival rewrites the rendering before it

    def describe(self) -> str:
        if self.ok:
            return "delta-append equals the full re-render"
        where = f"; {self.first_break}" if self.first_break else ""
        if self.first_mismatch is None:
            return f"{self.reason}{where}"
        return (f"{self.reason} (first difference at token {self.first_mismatch}; "
                f"delta-append has {self.incremental_context!r}, the full re-render has "
                f"{self.full_context!r}{where})")


class ChatRenderer:
    """Renders prompts and per-turn deltas as token ids with one tokenizer's chat template.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        allow_non_prefix_preserving: the old spelling of ``history_policy="keep_stream"``.
        check: run the check on the probe conversation now (`check_prefix_preserving`) and
            decide the history policy (`history`); without it ``history`` is None.
        chat_template_kwargs: extra keyword arguments for every ``apply_chat_template`` call
            (e.g. ``{"enable_thinking": False}``).
        family: the template's `toolrl.core.families.Family` (or its name); None: the family
            whose template this is, if any.
        history_policy: one of `toolrl.rollout.history.HISTORY_POLICIES` (``auto``: deltas
            for a prefix-preserving template, else ``per_turn``).
    """

    def __init__(self, tokenizer: Any, *, allow_non_prefix_preserving: bool = False,
                 check: bool = True,
                 chat_template_kwargs: Mapping[str, Any] | None = None,
                 family: Family | str | None = None, history_policy: str = "auto") -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.family: Family | None = get_family(family) if family is not None else \
            family_for_template(tokenizer.chat_template)
        if allow_non_prefix_preserving and history_policy == "auto":
            history_policy = "keep_stream"
        self.allow_non_prefix_preserving = history_policy == "keep_stream"
        self.template_kwargs = dict(chat_template_kwargs or {})
        turn_end = self.family.turn_end if self.family is not None else None
        self.eos_token_id: int = int(tokenizer.convert_tokens_to_ids(turn_end)) \
            if turn_end else int(tokenizer.eos_token_id)
        self.eos_text: str = tokenizer.convert_ids_to_tokens(self.eos_token_id)
        self._dummy_cache: dict[str, tuple[str, str]] = {}
        self._prompt_cache: dict[str, list[int]] = {}  # oldest first
        self.conformance: ConformanceReport | None = None
        self.history: HistoryDecision | None = None
        self._real = _real_tokenizer(tokenizer)  # a compact vocabulary's real tokenizer
        self._drop: set[int] | None = None  # `decode`: special ids not in the call format
        if check:
            self.conformance = self.check_prefix_preserving(PROBE_MESSAGES, PROBE_TOOLS)
            self.history = self.decide_history(history_policy)

    def decide_history(self, requested: str) -> HistoryDecision:
        """Pick the history policy for this template (`toolrl.rollout.history.decide`); log
        its line (a warning when it is not exact); `TemplateError` when it is refused."""
        report = self.conformance or self.check_prefix_preserving(PROBE_MESSAGES, PROBE_TOOLS)

        def recheck(kwargs: Mapping[str, Any]) -> tuple[bool, str]:
            saved = self.template_kwargs
            self.template_kwargs = {**saved, **kwargs}
            self._dummy_cache, self._prompt_cache = {}, {}
            try:
                again = self.check_prefix_preserving(PROBE_MESSAGES, PROBE_TOOLS)
            finally:
                self.template_kwargs = saved
            return again.ok, again.describe()

        try:
            decision = decide(requested, report.ok, report.describe(), family=self.family,
                              recheck=recheck)
        except HistoryPolicyError as e:
            raise TemplateError(str(e)) from None
        if decision.template_kwargs:
            self.template_kwargs.update(decision.template_kwargs)
            self._dummy_cache, self._prompt_cache = {}, {}
        (logger.info if decision.exact else logger.warning)(decision.line())
        self.history = decision
        return decision

    @property
    def per_turn(self) -> bool:
        """Each model turn is its own sample (`toolrl.rollout.history`, ``per_turn``)."""
        return self.history is not None and self.history.per_turn

    # --- the family's message conventions ----------------------------------------------------
    def template_messages(self, messages: Sequence[Message], tools: Tools = None
                          ) -> list[dict[str, Any]]:
        """``messages`` as the family's template takes them: tools in the system prompt when
        the template drops them, call arguments as a JSON string, no content beside calls."""
        out = [dict(m) for m in messages]
        fam = self.family
        if fam is None:
            return out
        if fam.arguments_as_string or fam.content_none_with_calls:
            for m in out:
                if not m.get("tool_calls"):
                    continue
                if fam.content_none_with_calls:
                    m["content"] = None
                if fam.arguments_as_string:
                    m["tool_calls"] = [_args_as_string(c) for c in m["tool_calls"]]
        if fam.tools_in_system and tools:
            listing = tool_listing(tools, fam.tool_format)
            if out and out[0].get("role") == "system":
                out[0]["content"] = f"{out[0].get('content') or ''}\n\n{listing}"
            else:
                out.insert(0, {"role": "system", "content": listing})
        return out

    def inference_message(self, text: str, parse: ParseResult | None) -> dict[str, Any]:
        """The assistant message an OpenAI-compatible server hands back for a sampled turn
        (and a client sends in the next request): the free text as ``content`` (the
        reasoning split off into ``reasoning_content`` for a family that reasons), the parsed
        calls as ``tool_calls``. What ``per_turn`` prompts render earlier turns from."""
        content = parse.text if parse is not None else text
        msg: dict[str, Any] = {"role": "assistant"}
        thinking = self.family.thinking if self.family is not None else None
        if thinking is not None:
            reasoning, content = thinking.split(content)
            if reasoning is not None:
                msg["reasoning_content"] = reasoning
        msg["content"] = content
        if parse is not None and parse.calls:
            msg["tool_calls"] = [c.to_openai() for c in parse.calls]
        return msg

    # --- rendering --------------------------------------------------------------------------
    def render_text(self, messages: Sequence[Message], tools: Tools = None,
                    add_generation_prompt: bool = False) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                self.template_messages(messages, tools), tools=_tools(tools),
                add_generation_prompt=add_generation_prompt, tokenize=False,
                **self.template_kwargs)
        except Exception as e:
            raise RenderError(f"the chat template failed to render: {e}") from e

    def encode(self, text: str) -> list[int]:
        """Token ids of a piece of rendered text (no special tokens added)."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        self._check_real(text, ids)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of sampled tokens as the env's parser reads it: special tokens dropped,
        but those of the family's call format kept (`Family.text_tokens`)."""
        keep = self.family.text_tokens if self.family is not None else ()
        if not keep:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)
        if self._drop is None:  # the special ids to drop: all but the format's own
            special = set(self.tokenizer.all_special_ids) | {
                i for i, t in self.tokenizer.added_tokens_decoder.items() if t.special}
            self._drop = special - set(self.tokenizer.convert_tokens_to_ids(list(keep)))
        return self.tokenizer.decode([i for i in ids if i not in self._drop],
                                     skip_special_tokens=False)

    def _check_real(self, text: str, ids: Sequence[int]) -> None:
        """With a compact vocabulary (`toolrl.models.compact`): the pieces must be the real
        tokenizer's, else `TemplateError` naming the text (nothing else is trained on)."""
        if self._real is None:
            return
        real, real_ids = self._real
        if [real_ids[i] for i in ids] != list(real.encode(text, add_special_tokens=False)):
            raise TemplateError(f"the compact vocabulary cannot hold {text[-60:]!r} as the "
                                f"real tokenizer splits it; the episode ends here")

    def render_prompt(self, messages: Sequence[Message], tools: Tools = None, *,
                      exact: bool = True) -> list[int]:
        """Token ids of the first prompt: the messages, the tools and the generation prompt.

        The last few prompts are remembered, so the samples of one GRPO group (the same task
        ``n`` times) render it once. ``exact=False`` skips a compact vocabulary's check
        against the real tokenizer (a probe that is never trained on).
        """
        key = json.dumps([list(messages), _tools(tools), exact], sort_keys=True, default=str)
        ids = self._prompt_cache.get(key)
        if ids is None:
            try:
                out = self.tokenizer.apply_chat_template(
                    self.template_messages(messages, tools), tools=_tools(tools),
                    add_generation_prompt=True, tokenize=True, **self.template_kwargs)
            except Exception as e:
                raise RenderError(f"the chat template failed to render: {e}") from e
            ids = _as_ids(out)
            if self._real is not None and exact:
                self._check_real(self.render_text(messages, tools, add_generation_prompt=True),
                                 ids)
            if len(self._prompt_cache) >= PROMPT_CACHE_SIZE:
                self._prompt_cache.pop(next(iter(self._prompt_cache)))
            self._prompt_cache[key] = ids
        return list(ids)

    def render_delta(self, new_messages: Sequence[Message], tools: Tools = None, *,
                     after_eos: bool = True, add_generation_prompt: bool = True) -> list[int]:
        """Tokens to append after a model turn: its closing, ``new_messages``, the next prompt.

        ``after_eos`` says the model's sampled tokens ended with the eos token; then the
        template's text after the eos (e.g. a newline) starts the delta. Otherwise (a stop
        string, a length cut) the whole closing of the assistant turn, eos included, does.
        None of these tokens were sampled: they get mask 0.
        """
        prefix, closing = self._dummy(tools)
        text = self.render_text(_dummy_messages() + list(new_messages), tools,
                                add_generation_prompt=add_generation_prompt)
        if not text.startswith(prefix):
            raise TemplateError("the chat template renders the previous assistant turn "
                                "differently once messages follow it (not prefix-preserving)")
        if after_eos:
            at = closing.find(self.eos_text)
            closing = closing[at + len(self.eos_text):] if at >= 0 else closing
        return self.encode(closing + text[len(prefix):])

    def _dummy(self, tools: Tools) -> tuple[str, str]:
        """(dummy conversation rendered, template text that closes its assistant turn)."""
        key = json.dumps(_tools(tools), sort_keys=True, default=str)
        if key not in self._dummy_cache:
            text = self.render_text(_dummy_messages(), tools)
            at = text.rfind(_MARK)
            if at < 0:
                raise TemplateError("the chat template does not render assistant content")
            self._dummy_cache[key] = (text, text[at + len(_MARK):])
        return self._dummy_cache[key]

    # --- conformance ------------------------------------------------------------------------
    def assistant_tokens(self, history: Sequence[Message], message: Message,
                         tools: Tools = None) -> list[int]:
        """The tokens a model samples for ``message`` after ``history``, eos included."""
        before = self.render_text(history, tools, add_generation_prompt=True)
        full = self.render_text([*history, message], tools)
        if not full.startswith(before):
            raise TemplateError("the generation prompt is not a prefix of the rendered "
                                "assistant turn")
        turn = full[len(before):]
        at = turn.find(self.eos_text)
        return self.encode(turn[: at + len(self.eos_text)] if at >= 0 else turn)

    def check_prefix_preserving(self, messages: Sequence[Message],
                                tools: Tools = None) -> ConformanceReport:
        """Replay ``messages`` as a rollout would (prompt, sampled turns, deltas) and compare
        the tokens with one full render of the conversation."""
        messages = list(messages)
        turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if not turns:
            raise ValueError("the conversation has no assistant message to replay")
        try:
            ids = self.render_prompt(messages[: turns[0]], tools)
            for k, i in enumerate(turns):
                ids += self.assistant_tokens(messages[:i], messages[i], tools)
                end = turns[k + 1] if k + 1 < len(turns) else len(messages)
                more = k + 1 < len(turns) or end > i + 1
                ids += self.render_delta(messages[i + 1: end], tools, after_eos=True,
                                         add_generation_prompt=more)
        except RenderError:
            raise
        except TemplateError as e:
            return ConformanceReport(False, 0, 0, reason=str(e),
                                     first_break=self.first_break(messages, tools))
        ends_with_model = messages[-1].get("role") == "assistant"
        full = self.encode(self.render_text(messages, tools,
                                            add_generation_prompt=not ends_with_model))
        if ids == full:
            return ConformanceReport(True, len(ids), len(full))
        at = next((j for j, (a, b) in enumerate(zip(ids, full, strict=False)) if a != b),
                  min(len(ids), len(full)))
        return ConformanceReport(
            False, len(ids), len(full), first_mismatch=at,
            incremental_context=self.tokenizer.decode(ids[max(0, at - 8): at + 8]),
            full_context=self.tokenizer.decode(full[max(0, at - 8): at + 8]),
            reason="delta-appended tokens differ from a full re-render",
            first_break=self.first_break(messages, tools))

    def first_break(self, messages: Sequence[Message], tools: Tools = None) -> str:
        """Where the template first rewrites history: the first message whose arrival changes
        the rendering of the messages before it ("" when none does)."""
        messages = list(messages)
        try:
            before = self.render_text(messages[:1], tools)
            for i in range(1, len(messages)):
                after = self.render_text(messages[: i + 1], tools)
                if not after.startswith(before):
                    at = next((j for j, (a, b) in enumerate(zip(before, after, strict=False))
                               if a != b), len(before))
                    return (f"message {i} ({messages[i].get('role')}) rewrites the rendering "
                            f"of the messages before it: {before[max(0, at - 20): at + 20]!r} "
                            f"becomes {after[max(0, at - 20): at + 20]!r}")
                before = after
        except TemplateError as e:
            return f"the template fails on a prefix of the conversation: {e}"
        return ""


# One tool whose every schema element carries a marker: what the rendered prompt lacks, the
# model never sees (`tool_coverage`).
COVERAGE_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "probe_tool_qz", "description": "Tooldescqz marker.",
    "parameters": {"type": "object", "required": ["pmainqz"], "properties": {
        "pmainqz": {"type": "string", "description": "Paramdescqz marker.",
                    "enum": ["enumvalqz", "enumothqz"]},
        "pcountqz": {"type": "integer", "default": 9137},
        "pnestqz": {"type": "object", "properties": {"nestedkeyqz": {"type": "string"}}}}}}}
COVERAGE_PARTS: dict[str, str] = {
    "tool names": "probe_tool_qz", "tool descriptions": "Tooldescqz",
    "parameter names": "pmainqz", "parameter descriptions": "Paramdescqz",
    "enum values": "enumvalqz", "defaults": "9137", "nested object properties": "nestedkeyqz"}


@dataclass(frozen=True)
class ToolCoverage:
    """What a chat template renders of a tool schema (`ChatRenderer.tool_coverage`)."""

    missing: tuple[str, ...]  # parts of COVERAGE_PARTS the prompt lacks

    @property
    def ok(self) -> bool:
        return not self.missing

    def describe(self) -> str:
        if self.ok:
            return "the chat template renders every part of the tool schemas"
        return (f"the chat template leaves {', '.join(self.missing)} out of the tools: the "
                f"model never sees them")


def tool_coverage(renderer: ChatRenderer) -> ToolCoverage:
    """Render a prompt with `COVERAGE_TOOL` and list the schema parts missing from it."""
    text = renderer.render_text([{"role": "user", "content": "hi"}], [COVERAGE_TOOL],
                                add_generation_prompt=True)
    return ToolCoverage(tuple(part for part, marker in COVERAGE_PARTS.items()
                              if marker not in text))


def drops_tools(renderer: ChatRenderer) -> bool:
    """The template renders a prompt with `PROBE_TOOLS` exactly as without them."""
    messages = PROBE_MESSAGES[:2]
    return renderer.render_text(messages, PROBE_TOOLS, add_generation_prompt=True) == \
        renderer.render_text(messages, None, add_generation_prompt=True)


def drops_tools_message(key: str, path: str) -> str:
    """The one line that refuses a template that drops ``tools`` (``key``: where the model
    was named, e.g. ``model.path``)."""
    return (f"{key}={path!r}: its chat template drops `tools` (a prompt renders the same with "
            f"and without them), so the model would never see its tools; give the checkpoint "
            f"a tools-aware template (`toolrl model import --chat-template chatml-tools`, or "
            f"set chat_template in its tokenizer_config.json)")


def tool_listing(tools: Sequence[Mapping[str, Any]], fmt: str) -> str:
    """The tools as system-prompt text, for a template that drops ``tools``: one
    ``name(a: type, b?: type) - description`` line per tool, then how to call them."""
    lines = ["Tools:"]
    for tool in tools:
        f = tool.get("function", tool)
        params = f.get("parameters") or {}
        required = set(params.get("required") or ())
        args = ", ".join(f"{k}{'' if k in required else '?'}: {_type(v)}"
                         for k, v in (params.get("properties") or {}).items())
        desc = f" - {f['description']}" if f.get("description") else ""
        lines.append(f"{f.get('name')}({args}){desc}")
    example = get_format(fmt).render([ToolCall("NAME", {"ARG": "VALUE"})])
    lines.append(f"To call a tool, write:\n{example}")
    return "\n".join(lines)


def _type(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return "|".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type", "any")
    return kind if isinstance(kind, str) else "|".join(kind)


def _args_as_string(call: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(call)
    fn = dict(out.get("function") or {})
    if not isinstance(fn.get("arguments"), str):
        fn["arguments"] = json.dumps(fn.get("arguments") or {}, ensure_ascii=False)
    out["function"] = fn
    return out


def _real_tokenizer(tokenizer: Any) -> tuple[Any, list[int]] | None:
    """(the real tokenizer, compact id -> real id) when ``tokenizer`` is a compact vocabulary
    (``toolrl_vocab.json`` beside it, `toolrl.models.compact`), else None."""
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    try:
        record = json.loads((folder / "toolrl_vocab.json").read_text())
    except (OSError, ValueError):
        return None
    # lazy: transformers takes seconds to import and only a compact vocabulary needs it here;
    # the episode runner (toolrl.EpisodeRunner) imports this module without transformers
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder / record["real_tokenizer"]), record["real_ids"]


def _dummy_messages() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARK}]


def _tools(tools: Tools) -> list[dict[str, Any]] | None:
    return [dict(t) for t in tools] if tools else None


def _as_ids(out: Any) -> list[int]:
    """apply_chat_template(tokenize=True) returns a BatchEncoding in transformers 5."""
    if isinstance(out, Mapping) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], list):
        if len(out) != 1:
            raise TemplateError(f"expected one rendered conversation, got {len(out)}")
        out = out[0]
    return [int(t) for t in out]


__all__ = [
    "PROBE_MESSAGES",
    "PROBE_TOOLS",
    "ChatRenderer",
    "ConformanceReport",
    "HistoryDecision",
    "TemplateError",
    "ToolCoverage",
    "drops_tools",
    "drops_tools_message",
    "tool_coverage",
    "tool_listing",
]
