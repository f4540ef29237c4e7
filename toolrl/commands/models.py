"""``toolrl make-tiny-model | model import | model fetch | check-template``: checkpoints and
their chat templates (torch and transformers)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from toolrl import wheels
from toolrl.models.families import family_tokenizer
from toolrl.models.gguf import GGUFImportError, fetch_model, import_gguf
from toolrl.models.source import ModelNotFoundError, require_model
from toolrl.models.tiny import build_tiny_model
from toolrl.rollout import chat, conformance
from toolrl.rollout.worker import RolloutConfig


def make_tiny_model(args: argparse.Namespace) -> int:
    config = None
    if args.config_json:
        try:
            config = json.loads(Path(args.config_json).read_text())
        except (OSError, ValueError) as e:
            print(f"make-tiny-model: cannot read {args.config_json}: {e}", file=sys.stderr)
            return 2
    path = build_tiny_model(args.out, seed=args.seed, size=args.size, config=config,
                            dtype=args.dtype)
    what = args.config_json or args.size
    print(f"model ({what}, random weights, seed {args.seed}) at {path}")
    return 0


def model_import(args: argparse.Namespace) -> int:
    try:
        import_gguf(args.gguf, args.out, chat_template=args.chat_template,
                    default_system=args.default_system, force=args.force)
    except (GGUFImportError, OSError) as exc:
        print(f"toolrl model import: {exc}", file=sys.stderr)
        return 2
    return note_template(args.out)


def model_fetch(args: argparse.Namespace) -> int:
    try:
        fetch_model(args.name, args.out, cache=args.cache, force=args.force)
    except (GGUFImportError, wheels.WheelError, OSError) as exc:
        print(f"toolrl model fetch: {exc}", file=sys.stderr)
        return 2
    return note_template(args.out)


def note_template(path: str) -> int:
    """A note (not a failure) when an imported checkpoint's template drops ``tools``."""
    try:
        renderer = chat.ChatRenderer(auto_tokenizer(path, key="--out"), check=False)
        if chat.drops_tools(renderer):
            print(f"note: the chat template of {path} drops `tools`; training and check-env "
                  f"refuse it: import with --chat-template chatml-tools", file=sys.stderr)
    except chat.TemplateError as exc:
        print(f"note: the chat template of {path} does not render: {exc}", file=sys.stderr)
    return 0


def check_template(args: argparse.Namespace) -> int:
    """``toolrl check-template MODEL``: the template's conformance report (`template_report`)."""
    try:
        tokenizer = template_tokenizer(args.model, args.family)
        renderer = chat.ChatRenderer(tokenizer, family=args.family,
                                     history_policy=args.history_policy)
    except (ValueError, chat.TemplateError, OSError) as exc:
        print(f"check-template: {exc}", file=sys.stderr)
        return 1
    print(f"check-template {args.model}")
    for line in conformance.template_report(renderer):
        print(f"  {line}")
    return 0


class TemplateCheckError(Exception):
    """A model's template that check-env refuses (it does not render, or it drops tools)."""


@dataclass(frozen=True)
class TemplateCheck:
    """What ``check-env --model`` learns of the model's chat template."""

    report: list[str]  # the conformance report's lines
    coverage: str  # what the template shows of the tool schemas (a note, not a check)
    count_tokens: Callable[[list, list], int]  # a first prompt's tokens, tools included
    default_budget: int  # the rollout's default prompt budget


def template_check(model: str) -> TemplateCheck:
    """The chat template of ``model`` (``--model``) as check-env counts prompts with it; a
    `TemplateCheckError` when it cannot be trained on."""
    try:
        renderer = chat.ChatRenderer(auto_tokenizer(model, key="--model"))
        dropped = chat.drops_tools(renderer)
    except (ModelNotFoundError, chat.TemplateError) as exc:
        raise TemplateCheckError(str(exc)) from exc
    if dropped:
        raise TemplateCheckError(chat.drops_tools_message("--model", model))
    try:
        coverage = chat.tool_coverage(renderer).describe()
    except chat.TemplateError as exc:
        coverage = f"not checked ({exc})"

    def count(messages: list, tools: list) -> int:
        return len(renderer.render_prompt(messages, tools))

    return TemplateCheck(report=list(conformance.template_report(renderer)), coverage=coverage,
                         count_tokens=count, default_budget=RolloutConfig().max_prompt_len)


def template_tokenizer(model: str, family: str | None) -> Any:
    """A model folder's tokenizer, or (``family:NAME``) a family's real one from its wheel."""
    if model.startswith("family:"):
        return family_tokenizer(model.removeprefix("family:"))
    return auto_tokenizer(model, key="MODEL")


def auto_tokenizer(model: str, key: str) -> Any:
    """``AutoTokenizer`` of a model folder or a hub id (``key`` names it in an error)."""
    return AutoTokenizer.from_pretrained(require_model(model, key=key))
