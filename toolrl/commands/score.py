"""``toolrl score-calls | score``: offline scoring, of candidate tool calls and of saved
trajectories (rollout dumps, eval transcripts), with any reward."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from toolrl.reward import RewardConfigError, score_trajectories
from toolrl.reward.score_calls import score_calls as score_call_file
from toolrl.reward.score_calls import stats_table


def score_calls(args: argparse.Namespace) -> int:
    try:
        stats = score_call_file(args.reward, args.input, args.output,
                                kwargs=json.loads(args.kwargs),
                                pass_threshold=args.pass_threshold)
    except (OSError, ValueError) as exc:
        print(f"score-calls: {exc}", file=sys.stderr)
        return 2
    Console().print(stats_table(stats, title=f"{args.reward} on {args.input}"))
    return 0


def score(args: argparse.Namespace) -> int:
    if (args.reward is None) == (args.config is None):
        print("score: give --reward ID (with --kwargs) or --config FILE", file=sys.stderr)
        return 2
    per_env: dict = {}
    default_env = None
    try:
        if args.config is not None:
            # lazy: torch and transformers (the trainer's config, seconds), for --config only
            from toolrl.trainer.config import ConfigError, load_config

            try:
                cfg = load_config(args.config)
            except ConfigError as exc:
                raise ValueError(exc) from None
            reward, per_env, default_env = cfg.reward, cfg.env_rewards, cfg.env.id
        else:
            kwargs = json.loads(args.kwargs)
            if not isinstance(kwargs, dict):
                raise ValueError(f"--kwargs must be a JSON object, got {args.kwargs}")
            reward = {"rewards": [{"name": args.reward, "kwargs": kwargs}]}
        items = score_trajectories.read_trajectories(args.input)
        summary = score_trajectories.score_trajectories(items, reward, args.output,
                                                        per_env=per_env, default_env=default_env)
    except (OSError, ValueError, RewardConfigError) as exc:
        print(f"score: {exc}", file=sys.stderr)
        return 2
    Console().print(score_trajectories.summary_table(
        summary, title=args.reward or f"{args.config}'s rewards"))
    return 0
