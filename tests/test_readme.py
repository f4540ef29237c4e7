"""The README is a front door: short, its links resolve, its numbers are the measured ones.

What the README used to hold moved to the documentation site (`docs/`); `tests/test_docs.py`
runs the guides' code blocks (the own-env guide end to end, as this file used to run the
README's section) and the strict build."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_short():
    assert len(README.splitlines()) < 200


def test_readme_links_resolve():
    targets = [t for t in LINK.findall(README) if not re.match(r"[a-z]+://", t)]
    assert targets, "the README links into the site"
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, missing


def test_readme_links_into_every_guide_and_concept():
    linked = {t.split("#")[0] for t in LINK.findall(README)}
    pages = {str(p.relative_to(ROOT)) for folder in ("guides", "concepts")
             for p in (ROOT / "docs" / folder).glob("*.md")}
    assert pages - {"docs/concepts/index.md"} <= linked, sorted(pages - linked)


def test_readme_has_the_two_commands():
    block = re.search(r"```bash\n(.*?)```", README, re.DOTALL).group(1)
    assert [line.split()[:2] for line in block.splitlines()] == [["make", "demo"],
                                                                 ["make", "test"]]


def test_quickstart_numbers_are_the_measured_ones():
    """The numbers the README quotes are the getting-started page's measurements."""
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    seed0 = re.search(r"^\| seed 0 \|(.*)\|$", page, re.MULTILINE).group(1).split("|")
    first, last, gain = seed0[0].strip(), seed0[4].strip(), seed0[5].strip()
    text = " ".join(README.split())
    assert f"from {first} to {last} for seed 0 ({gain} points" in text
    mean = re.search(r"The mean gain of the three seeds is (\+[\d.]+) points", page).group(1)
    assert f"the mean gain of three seeds is {mean}" in text
