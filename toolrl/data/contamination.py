"""Is a training set in the evaluation set? Questions and function names the two share.

A training row and an evaluation row share a *question* when their user messages are the
same text after normalising case, whitespace and punctuation (`normalize`); such a training
set is contaminated. Shorter overlaps are counted too: training questions that share a run of
`NGRAM` words with an evaluation question (the n-gram test GPT-3's paper used), listed for a
reader to judge. Shared *function names* are reported, not refused: a training set may teach
``calculate_area`` and an evaluation may test it with a different question.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolrl.core import bfcl_multi_turn as mt

NGRAM = 13
_WORD = re.compile(r"[a-z0-9]+")


def normalize(text: str) -> str:
    """Lower case, words only, one space between them."""
    return " ".join(_WORD.findall(text.lower()))


def question_of(row: Mapping[str, Any]) -> str:
    """The user text of a row (its user messages, joined; BFCL's ``question`` too)."""
    messages = row.get("messages")
    if messages is None:
        question = row.get("question")
        if isinstance(question, str):
            return question
        messages = [m for turn in question or [] for m in (turn if isinstance(turn, list)
                                                           else [turn])]
    return "\n".join(str(m.get("content") or "") for m in messages
                     if isinstance(m, Mapping) and m.get("role") == "user")


def function_names(row: Mapping[str, Any]) -> set[str]:
    """Names of the tools a row offers (OpenAI tools, bare functions, BFCL ``function``, or a
    BFCL multi-turn entry's ``involved_classes``: their documented functions)."""
    tools = row.get("tools") or row.get("function") or []
    classes = row.get("involved_classes")
    if not tools and isinstance(classes, list):
        tools = mt.function_docs([c for c in classes if c in mt.CLASSES])
    tools = tools if isinstance(tools, list) else [tools]
    names = set()
    for tool in tools:
        if isinstance(tool, Mapping):
            function = tool.get("function", tool) if tool.get("type") == "function" else tool
            if isinstance(function, Mapping) and isinstance(function.get("name"), str):
                names.add(function["name"])
    return names


@dataclass
class ContaminationReport:
    """What a training set shares with an evaluation set."""

    train_rows: int
    eval_rows: int
    shared_questions: list[tuple[Any, Any, str]] = field(default_factory=list)  # train, eval id
    ngram_overlaps: list[tuple[Any, Any, str]] = field(default_factory=list)  # the shared span
    shared_functions: Counter[str] = field(default_factory=Counter)  # name -> train rows
    flagged: set[int] = field(default_factory=set)  # training rows (by position) in either list

    @property
    def clean(self) -> bool:
        """No training question is an evaluation question."""
        return not self.shared_questions

    def lines(self, shown: int = 5) -> list[str]:
        out = [f"{self.train_rows} training rows vs {self.eval_rows} evaluation rows: "
               f"{len(self.shared_questions)} shared questions, "
               f"{len(self.ngram_overlaps)} training questions sharing {NGRAM} words in a row, "
               f"{len(self.shared_functions)} shared function names"]
        for train_id, eval_id, text in self.shared_questions[:shown]:
            out.append(f"  shared question: train {train_id!r} = eval {eval_id!r}: {text[:80]!r}")
        for train_id, eval_id, span in self.ngram_overlaps[:shown]:
            out.append(f"  {NGRAM}-word overlap: train {train_id!r} / eval {eval_id!r}: "
                       f"{span!r}")
        if self.shared_functions:
            names = ", ".join(f"{n} ({k} rows)" for n, k in self.shared_functions.most_common())
            out.append(f"  shared function names: {names}")
        return out


def check_contamination(train: Iterable[Mapping[str, Any]], evaluation: Iterable[Mapping[str, Any]],
                        ngram: int = NGRAM) -> ContaminationReport:
    """Compare every training row with every evaluation row (see the module docstring)."""
    train, evaluation = list(train), list(evaluation)
    report = ContaminationReport(len(train), len(evaluation))
    questions: dict[str, Any] = {}
    grams: dict[tuple[str, ...], Any] = {}
    eval_names: set[str] = set()
    for row in evaluation:
        text = normalize(question_of(row))
        questions.setdefault(text, row.get("id"))
        words = text.split()
        for i in range(len(words) - ngram + 1):
            grams.setdefault(tuple(words[i:i + ngram]), row.get("id"))
        eval_names |= function_names(row)
    for index, row in enumerate(train):
        text = normalize(question_of(row))
        if text and text in questions:
            report.shared_questions.append((row.get("id"), questions[text], text))
            report.flagged.add(index)
        else:
            words = text.split()
            for i in range(len(words) - ngram + 1):
                gram = tuple(words[i:i + ngram])
                if gram in grams:
                    report.ngram_overlaps.append((row.get("id"), grams[gram], " ".join(gram)))
                    report.flagged.add(index)
                    break
        for name in function_names(row) & eval_names:
            report.shared_functions[name] += 1
    return report


def decontaminate(train: Iterable[Mapping[str, Any]], evaluation: Iterable[Mapping[str, Any]],
                  ngram: int = NGRAM) -> tuple[list[Mapping[str, Any]], ContaminationReport]:
    """The training rows that share no question and no ``ngram``-word run with the evaluation
    rows, and the report of what was dropped."""
    train = list(train)
    report = check_contamination(train, evaluation, ngram=ngram)
    return [row for i, row in enumerate(train) if i not in report.flagged], report


__all__ = ["NGRAM", "ContaminationReport", "check_contamination", "decontaminate",
           "function_names", "normalize", "question_of"]
