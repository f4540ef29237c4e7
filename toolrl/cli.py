"""The `toolrl` command line. Each subcommand is one small function taking parsed args."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

Command = Callable[[argparse.Namespace], int | None]


def _make_tiny_model(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from toolrl.models.tiny import build_tiny_model

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


def _score_calls(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console

    from toolrl.reward.score_calls import score_calls, stats_table

    try:
        stats = score_calls(args.reward, args.input, args.output, kwargs=json.loads(args.kwargs),
                            pass_threshold=args.pass_threshold)
    except (OSError, ValueError) as exc:
        print(f"score-calls: {exc}", file=sys.stderr)
        return 2
    Console().print(stats_table(stats, title=f"{args.reward} on {args.input}"))
    return 0


def _data_convert(args: argparse.Namespace) -> int:
    from toolrl.data.convert import convert

    try:
        report = convert(args.format, args.inputs, args.out, answers=args.answers,
                         limit=args.limit)
    except (OSError, ValueError) as exc:
        print(f"toolrl data convert: {exc}", file=sys.stderr)
        return 2
    print(f"{report.summary()} -> {args.out}")
    for index, record_id, message in report.errors[:5]:
        print(f"  error in record {index} (id {record_id!r}): {message}")
    if report.errors:
        print(f"  every error: {args.out}.errors.jsonl")
    return 0 if report.written else 1


def _broken_plugins(registry: object) -> int:
    """Print one line per plugin of ``registry`` that failed to import (stderr); their
    count."""
    failures = registry.failures()  # type: ignore[attr-defined]
    for message in failures.values():
        print(f"broken plugin: {message}", file=sys.stderr)
    return len(failures)


def _rewards(args: argparse.Namespace) -> int:
    from toolrl.reward import REWARDS, get_reward_spec

    for name in REWARDS.names():
        print(f"{name:20s} {get_reward_spec(name).description}")
    return 1 if _broken_plugins(REWARDS) else 0  # the others are listed all the same


def _envs(args: argparse.Namespace) -> int:
    from toolrl.core.checks import describe_envs
    from toolrl.core.registration import ENVS

    for env_id, tools in describe_envs():
        print(f"{env_id:28s} {tools}")
    return 1 if _broken_plugins(ENVS) else 0  # the others are listed all the same


def _check_env(args: argparse.Namespace) -> int:
    import json

    from toolrl.core.checks import check_tool_env
    from toolrl.core.registration import ENVS

    report = check_tool_env(args.id, seed=args.seed, env_kwargs=json.loads(args.kwargs))
    print(report)
    _broken_plugins(ENVS)  # named, but they do not fail the check of another env
    return 0 if report.ok else 1


def _train(args: argparse.Namespace) -> int:
    from toolrl.trainer.run import run_training

    return _run_experiment("train", args, run_training)


def _eval(args: argparse.Namespace) -> int:
    from toolrl.trainer.evaluate import run_evaluation

    return _run_experiment("eval", args,
                           lambda cfg: run_evaluation(cfg, args.model, args.output_dir))


def _run_experiment(command: str, args: argparse.Namespace,
                    run: Callable[[object], object]) -> int:
    """Load the config, then run. Bad configs (env and reward ids and kwargs included),
    prompts over budget, pools that do not fit the cluster and a run dir in use are one clear
    line on stderr (exit 2) before any worker starts; a run stopped by its health check is one
    line too (exit 1). ``--debug`` shows the traceback instead."""
    from toolrl.controller.resources import ResourceError
    from toolrl.reward import RewardConfigError
    from toolrl.trainer.config import ConfigError, load_config
    from toolrl.trainer.health import UnhealthyRun
    from toolrl.trainer.run_dir import RunDirInUse

    try:
        cfg = load_config(args.config, args.overrides)
        run(cfg)
    except (ConfigError, RewardConfigError, FileNotFoundError, ResourceError,
            RunDirInUse) as e:
        if args.debug:
            raise
        print(f"toolrl {command}: {e}", file=sys.stderr)
        return 2
    except UnhealthyRun as e:
        if args.debug:
            raise
        print(f"toolrl {command}: stopped: {e}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    from toolrl.models.tiny import size_names

    parser = argparse.ArgumentParser(prog="toolrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("make-tiny-model", help="build a checkpoint with random weights and the "
                       "tiny tokenizer locally: a tiny Qwen2, or a real model's shape")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", choices=size_names(), default="small",
                   help="a tiny size, or a released model's shape (real vocabulary size)")
    p.add_argument("--config-json", default=None,
                   help="a Hugging Face config.json (with model_type) to build instead of --size")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="dtype of the saved weights (default: float32 tiny, bfloat16 real)")
    p.set_defaults(func=_make_tiny_model)

    p = sub.add_parser("train", help="run an RL experiment from a config file")
    p.add_argument("--config", required=True, help="YAML file (see configs/)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.lr=1e-5")
    p.add_argument("--debug", action="store_true", help="show tracebacks of config errors")
    p.set_defaults(func=_train)

    p = sub.add_parser("eval", help="evaluate a model with a config's env and rewards")
    p.add_argument("--config", required=True)
    p.add_argument("--model", required=True, help="checkpoint directory or hub id")
    p.add_argument("--output-dir", required=True, help="where results.json goes")
    p.add_argument("overrides", nargs="*", help="key=value overrides")
    p.add_argument("--debug", action="store_true", help="show tracebacks of config errors")
    p.set_defaults(func=_eval)

    p = sub.add_parser("score-calls", help="score candidate tool calls offline with a reward")
    p.add_argument("--reward", required=True, help="registered reward id, e.g. bfcl_ast")
    p.add_argument("--input", required=True, help="JSONL: id, category, tools, ground_truth, "
                   "candidate")
    p.add_argument("--output", required=True, help="JSONL written: id, score, error")
    p.add_argument("--kwargs", default="{}", help="JSON object of reward kwargs")
    p.add_argument("--pass-threshold", type=float, default=1.0,
                   help="a sample counts as correct when its score >= this")
    p.set_defaults(func=_score_calls)

    p = sub.add_parser("data", help="convert public function-calling datasets to task rows")
    data = p.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")
    p = data.add_parser("convert", help="public training set (or BFCL) -> FunctionCalling rows")
    p.add_argument("--from", dest="format", required=True,
                   choices=["xlam", "toolace", "hermes", "glaive", "bfcl"],
                   help="the input's format")
    p.add_argument("inputs", nargs="+", help="JSON, JSONL or parquet files (BFCL: question "
                   "files, e.g. BFCL_v4_simple_python.json)")
    p.add_argument("--out", required=True, help="the JSONL file written")
    p.add_argument("--answers", default=None, help="BFCL only: a possible-answer file or "
                   "folder (default: possible_answer/ beside each question file)")
    p.add_argument("--limit", type=int, default=None, help="convert at most N records")
    p.set_defaults(func=_data_convert)

    p = sub.add_parser("rewards", help="list registered reward ids")
    p.set_defaults(func=_rewards)

    p = sub.add_parser("envs", help="list registered env ids with their tools")
    p.set_defaults(func=_envs)

    p = sub.add_parser("check-env", help="gymnasium's check_env plus toolrl's env checks")
    p.add_argument("id", help="env id, e.g. toolrl/Calculator-v0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kwargs", default="{}", help="JSON object of env kwargs")
    p.set_defaults(func=_check_env)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
