"""docs/reliability.md names a test for every claim: each file and test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
SPAN = re.compile(r"`([^`]+)`")
FILE = re.compile(r"^((?:tests|tools)/[\w/]+\.py)(?:::([\w\[\]-]+))?$")
NAME = re.compile(r"^::([\w\[\]-]+)$")


def named_tests(text: str) -> list[tuple[int, str, str | None]]:
    """(line, file, test or None) for every test a table row names. ``::name`` alone refers to
    the last file named before it in the same table (the sandbox table names it once)."""
    out: list[tuple[int, str, str | None]] = []
    current: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            current = None
            continue
        for span in SPAN.findall(line):
            if m := FILE.match(span):
                current = m[1]
                out.append((number, current, m[2]))
            elif (m := NAME.match(span)) and current is not None:
                out.append((number, current, m[1]))
    return out


def missing(text: str) -> list[str]:
    bad = []
    for number, file, test in named_tests(text):
        path = ROOT / file
        if not path.is_file():
            bad.append(f"line {number}: no file {file}")
        elif test is not None:
            name = test.split("[")[0]
            if not re.search(rf"^\s*(?:async\s+)?def {re.escape(name)}\(", path.read_text(),
                             re.MULTILINE):
                bad.append(f"line {number}: {file} has no test {name}")
    return bad


def test_every_test_the_reliability_table_names_exists():
    text = DOC.read_text(encoding="utf-8")
    assert len(named_tests(text)) > 50
    assert missing(text) == []


def test_a_renamed_test_is_caught():
    row = ("| fault | behaviour | `tests/workers/test_host_memory.py::test_no_such_test`, "
           "`::test_freed_heap_blocks_are_handed_back`, `tests/no_such_file.py` |")
    assert missing(row) == ["line 1: tests/workers/test_host_memory.py has no test "
                            "test_no_such_test", "line 1: no file tests/no_such_file.py"]
