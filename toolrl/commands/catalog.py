"""``toolrl envs | rewards | model families | check-env``: what toolrl knows by name, and the
env check. Light: gymnasium and the plugins, no torch (``check-env --model`` loads it)."""

from __future__ import annotations

import argparse
import json
import sys

from toolrl.core import checks, registration
from toolrl.core.families import FAMILIES
from toolrl.registry import Registry
from toolrl.reward import REWARDS, get_reward_spec


def broken_plugins(registry: Registry) -> int:
    """Print one line per plugin of ``registry`` that failed to import (stderr); their
    count."""
    failures = registry.failures()
    for message in failures.values():
        print(f"broken plugin: {message}", file=sys.stderr)
    return len(failures)


def rewards(args: argparse.Namespace) -> int:
    for name in REWARDS.names():
        print(f"{name:20s} {get_reward_spec(name).description}")
    return 1 if broken_plugins(REWARDS) else 0  # the others are listed all the same


def envs(args: argparse.Namespace) -> int:
    for env_id, tools in checks.describe_envs():
        print(f"{env_id:28s} {tools}")
    return 1 if broken_plugins(registration.ENVS) else 0  # the others are listed all the same


def model_families(args: argparse.Namespace) -> int:
    for name in FAMILIES.names():
        f = FAMILIES.get(name)
        print(f"{name:22s} {f.tool_format:9s} {f.requirement or 'built locally':52s} {f.title}")
    return 0


def check_env(args: argparse.Namespace) -> int:
    count = None
    coverage = None  # what the model's template shows of the tool schemas (a note, not a check)
    budget = args.max_prompt_tokens
    if args.model:
        # lazy: transformers and torch (seconds), for --model only: `check-env ID` stays light
        from toolrl.commands.models import TemplateCheckError, template_check

        try:
            template = template_check(args.model)
        except TemplateCheckError as exc:
            print(f"check-env: {exc}", file=sys.stderr)
            return 1
        for line in template.report:
            print(f"template: {line}")
        count, coverage = template.count_tokens, template.coverage
        budget = budget if budget is not None else template.default_budget
    report = checks.check_tool_env(args.id, seed=args.seed, env_kwargs=json.loads(args.kwargs),
                                   max_turns=args.max_turns, count_tokens=count,
                                   max_prompt_tokens=budget)
    print(report)
    if coverage is not None:
        print(f"  tool schemas: {coverage}")
    if count is None and report.ok:
        print("  (prompt budget not checked: give --model to count prompt tokens)")
    broken_plugins(registration.ENVS)  # named, but they do not fail the check of another env
    return 0 if report.ok else 1
