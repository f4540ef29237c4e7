"""BFCL's multi-turn entries as ``toolrl/BFCLMultiTurn-v0`` rows.

A row is BFCL's entry as its question file has it (``id``, ``question``: turns of messages,
``initial_config``, ``involved_classes``, ``missed_function`` for ``miss_func``), joined by id
with its possible answer (``ground_truth``: per turn, BFCL's call strings), plus ``env``,
``category`` (the row's own, else BFCL's reading of the id) and ``source``. BFCL's four scored
categories ship in the ``bfcl-eval`` wheel's ``data/``, the unused ``multi_turn_composite`` set
in ``data/unused_datasets/question/`` with its answers in ``.../possible_answer/``.

``source`` is ``"bfcl"`` for BFCL's own files (their categories count in BFCL's summary of a
``toolrl eval``); your own rows in BFCL's shape (`load_bfcl_multi_turn` with ``own=True``,
``toolrl data convert --from bfcl-multi-turn``) keep theirs, ``"own"`` by default.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolrl.core import bfcl_multi_turn as mt
from toolrl.data.loader import iter_rows
from toolrl.wheels import BFCL_EVAL, obtain_wheel

ENV = "toolrl/BFCLMultiTurn-v0"
CATEGORIES = (*mt.MULTI_TURN_CATEGORIES, *mt.TRAINING_CATEGORIES)
_FIELDS = ("id", "question", "initial_config", "involved_classes", "missed_function")


def is_multi_turn_entry(row: Mapping[str, Any]) -> bool:
    """A record in BFCL's multi-turn shape (``question`` and ``involved_classes``)."""
    return "question" in row and "involved_classes" in row


def bfcl_multi_turn_file(category: str) -> Path:
    """The question file of a BFCL multi-turn category in the ``bfcl-eval`` wheel."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r}; valid: "
                         f"{', '.join(CATEGORIES)}")
    root = obtain_wheel(BFCL_EVAL).root / "bfcl_eval" / "data"
    name = f"BFCL_v4_{category}.json"
    return root / name if category in mt.MULTI_TURN_CATEGORIES else \
        root / "unused_datasets" / "question" / name


def answers_path(questions: str | os.PathLike) -> Path:
    """Where BFCL keeps the possible answers of a question file (``possible_answer/`` beside
    it; for ``unused_datasets/question/X``, ``unused_datasets/possible_answer/X``)."""
    questions = Path(questions)
    parent = questions.parent.parent if questions.parent.name == "question" else \
        questions.parent
    return parent / "possible_answer" / questions.name


def multi_turn_row(entry: Mapping[str, Any], answer: Any, *, source: str = "bfcl",
                   category: str | None = None) -> dict[str, Any]:
    """One BFCL multi-turn entry and its possible answer as a row (nothing checked here)."""
    row = {"id": entry["id"], "env": ENV, "source": entry.get("source", source),
           "category": category or entry.get("category") or mt.category_of_id(entry["id"])}
    row.update({k: entry[k] for k in _FIELDS[1:] if k in entry})
    row["ground_truth"] = answer
    return row


def load_bfcl_multi_turn(questions: str | os.PathLike, answers: str | os.PathLike | None = None,
                         limit: int | None = None, *, own: bool = False
                         ) -> list[dict[str, Any]]:
    """Rows of a BFCL multi-turn question file (or a category name: its file in the wheel),
    joined by id with the possible answers (default: BFCL's layout beside the file; none
    needed when every entry carries its ``ground_truth``). ``own``: your rows in BFCL's shape
    (they keep their ``source``, default ``"own"``). Raises ValueError naming what is missing.
    """
    if isinstance(questions, str) and questions in CATEGORIES:
        questions = bfcl_multi_turn_file(questions)
    questions = Path(questions)
    entries = list(itertools.islice(iter_rows(questions), limit))
    strays = [i for i, e in enumerate(entries) if not is_multi_turn_entry(e)]
    if strays:
        fields = ", ".join(map(repr, entries[strays[0]])) or "none"
        raise ValueError(f"{questions}: record {strays[0]} is not a BFCL multi-turn entry (it "
                         f"lacks 'question' or 'involved_classes'; it has {fields})")
    truth: dict[Any, Any] = {e["id"]: e["ground_truth"] for e in entries if "ground_truth" in e}
    wanted = {e["id"] for e in entries} - set(truth)
    if wanted:
        path = Path(answers) if answers is not None else answers_path(questions)
        if path.is_dir():
            path = path / questions.name
        if not path.exists():
            raise ValueError(f"{questions}: {len(wanted)} entries have no 'ground_truth' and "
                             f"their possible answers are not at {path}; pass BFCL's "
                             f"possible-answer file")
        for i, answer in enumerate(iter_rows(path)):
            if "ground_truth" not in answer:
                raise ValueError(f"{path} is not a BFCL possible-answer file: record {i} has "
                                 f"no 'ground_truth'")
            if answer["id"] in wanted:
                truth[answer["id"]] = answer["ground_truth"]
                wanted.discard(answer["id"])
                if not wanted:
                    break
        if wanted:
            raise ValueError(f"{path}: no possible answer for {len(wanted)} entries of "
                             f"{questions} (first: {sorted(wanted)[:3]})")
    source = "own" if own else "bfcl"
    return [multi_turn_row(e, truth[e["id"]], source=source) for e in entries]


__all__ = ["CATEGORIES", "ENV", "answers_path", "bfcl_multi_turn_file", "is_multi_turn_entry",
           "load_bfcl_multi_turn", "multi_turn_row"]
