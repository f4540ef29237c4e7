"""The `toolrl` command line. Each subcommand is one small function taking parsed args."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

Command = Callable[[argparse.Namespace], int | None]


def _make_tiny_model(args: argparse.Namespace) -> int:
    from toolrl.models.tiny import build_tiny_model

    path = build_tiny_model(args.out, seed=args.seed, size=args.size)
    print(f"tiny model ({args.size}, seed {args.seed}) at {path}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from toolrl.demo import run_demo

    return run_demo(args.model, num_samples=args.num_samples, max_tokens=args.max_tokens)


def build_parser() -> argparse.ArgumentParser:
    from toolrl.models.tiny import SIZES

    parser = argparse.ArgumentParser(prog="toolrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("make-tiny-model", help="build a tiny Qwen2 checkpoint + tokenizer locally")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.set_defaults(func=_make_tiny_model)

    p = sub.add_parser("demo", help="the longest end-to-end path that exists, on the tiny model")
    p.add_argument("--model", required=True, help="model directory or hub id")
    p.add_argument("--num-samples", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
