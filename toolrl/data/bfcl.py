"""BFCL's own files as FunctionCalling rows, exactly as BFCL v4 ships them.

A question file (``BFCL_v4_<category>.json``: JSON lines of ``id``, ``question``, ``function``)
and, for the AST categories, its possible-answer file (``possible_answer/BFCL_v4_<category>.json``:
``id``, ``ground_truth``). Each row gets BFCL's category (from the file name, else from the id
as BFCL's ``extract_test_category_from_id`` reads it), its ground truth (joined by id, after
which nothing is inferred), the tools as BFCL prompts them (each description ends with BFCL's
language hint: Python's, Java's or JavaScript's) and ``source: "bfcl"``. The schemas keep BFCL's
type names (Java's and JavaScript's too), which the checker reads exactly; the env presents them
to the model as JSON Schema (Java and JavaScript parameters as strings of source code, as BFCL
does: `toolrl.core.bfcl_languages.presented_tools`).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolrl.core.bfcl import check_mode
from toolrl.core.bfcl_languages import HINTS, language_of
from toolrl.data.loader import iter_rows

FUNCTION_CALLING_ENV = "toolrl/FunctionCalling-v0"
LANGUAGE_HINT = HINTS["python"]
_FILE = re.compile(r"BFCL_v\d+_(\w+?)(?:_score|_result)?\.json$")


def category_from_id(entry_id: str) -> str:
    """BFCL's ``extract_test_category_from_id`` (``live_simple_3-2-0`` -> ``live_simple``)."""
    return entry_id.split(":")[0].rsplit("_", 1)[0]


def category_from_file(path: str | os.PathLike) -> str | None:
    """The category in a BFCL file name (``BFCL_v4_simple_python.json`` -> ``simple_python``)."""
    match = _FILE.search(Path(path).name)
    return match.group(1) if match else None


def is_bfcl_row(row: Mapping[str, Any]) -> bool:
    """A row in BFCL's question layout (``question`` and ``function``, no ``messages``)."""
    return "question" in row and "function" in row and "messages" not in row


def bfcl_row(entry: Mapping[str, Any], category: str,
             answer: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One BFCL question entry (and its possible answer) as a FunctionCalling row."""
    question = entry["question"]
    if isinstance(question, str):
        messages = [{"role": "user", "content": question}]
    elif question and all(isinstance(turn, list) for turn in question):
        if len(question) != 1:
            raise ValueError(f"BFCL entry {entry.get('id')!r} has {len(question)} turns; "
                             f"FunctionCalling rows are single-turn (BFCL's multi-turn "
                             f"entries are toolrl/BFCLMultiTurn-v0 rows: toolrl data "
                             f"convert --from bfcl)")
        messages = [dict(m) for m in question[0]]
    else:
        messages = [dict(m) for m in question]
    functions = entry["function"]
    functions = functions if isinstance(functions, list) else [functions]
    hint = HINTS[language_of(category) or "python"]
    tools = [{"type": "function", "function": {
        **f, "description": str(f.get("description", "")) + hint}} for f in functions]
    row = {"id": entry["id"], "env": FUNCTION_CALLING_ENV, "source": "bfcl",
           "category": category, "messages": messages, "tools": tools}
    mode = check_mode(category)
    if mode in ("irrelevance", "relevance"):
        row["ground_truth"] = []
    elif answer is None:
        raise ValueError(f"BFCL entry {entry['id']!r} ({category}) has no possible answer")
    else:
        row["ground_truth"] = answer["ground_truth"]
    return row


def answers_path(questions: str | os.PathLike) -> Path:
    """Where BFCL keeps the possible answers of a question file."""
    questions = Path(questions)
    return questions.parent / "possible_answer" / questions.name


def load_bfcl(questions: str | os.PathLike, answers: str | os.PathLike | None = None,
              limit: int | None = None) -> list[dict[str, Any]]:
    """FunctionCalling rows from a BFCL question file and its possible-answer file.

    ``answers`` defaults to BFCL's layout (``possible_answer/`` beside the question file). A
    category toolrl cannot score, a missing answer file or an entry without an answer raise a
    ValueError that says which. ``limit``: the first N questions; BFCL's JSON lines files
    are then read no further than those questions and their answers.
    """
    entries = list(itertools.islice(iter_rows(questions), limit))
    strays = [e for e in entries if not is_bfcl_row(e)]
    if strays:
        fields = ", ".join(map(repr, strays[0])) or "none"
        raise ValueError(f"{questions} is not a BFCL question file: {len(strays)} of "
                         f"{len(entries)} records lack BFCL's 'question' and 'function' "
                         f"(record {entries.index(strays[0])} has {fields}); "
                         f"convert it with another --from format")
    file_category = category_from_file(questions)
    categories = [file_category or category_from_id(str(e.get("id", ""))) for e in entries]
    for category in dict.fromkeys(categories):
        try:
            check_mode(category)
        except ValueError as exc:
            raise ValueError(f"{questions}: {exc}") from None
    needs_answers = any(check_mode(c) not in ("irrelevance", "relevance") for c in categories)
    truth: dict[Any, Mapping[str, Any]] = {}
    if needs_answers:
        answers = Path(answers) if answers is not None else answers_path(questions)
        if answers.is_dir():
            answers = answers / Path(questions).name
        if not answers.exists():
            raise ValueError(f"{questions}: its possible answers are not at {answers}; pass "
                             f"BFCL's possible_answer/{Path(questions).name}")
        truth = {}
        wanted = {e["id"] for e in entries}
        for i, answer in enumerate(iter_rows(answers)):
            if "ground_truth" not in answer:
                hint = " (it is a question file)" if is_bfcl_row(answer) else ""
                raise ValueError(f"{answers} is not a BFCL possible-answer file{hint}: record "
                                 f"{i} has no 'ground_truth'; pass BFCL's "
                                 f"possible_answer/{Path(questions).name} as --answers")
            truth[answer["id"]] = answer
            wanted.discard(answer["id"])
            if limit is not None and not wanted:
                break
        missing = [e["id"] for e, c in zip(entries, categories, strict=True)
                   if e["id"] not in truth and check_mode(c) not in ("irrelevance", "relevance")]
        if missing:
            raise ValueError(f"{answers}: no possible answer for {len(missing)} entries of "
                             f"{questions} (first: {missing[:3]})")
    return [bfcl_row(e, c, truth.get(e["id"])) for e, c in zip(entries, categories, strict=True)]
