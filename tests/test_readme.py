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
    """The README's seed-0 curve and mean gain are one CPU's rows of quickstart.json."""
    import json

    text = " ".join(README.split())
    m = re.search(r"goes from ([\d.]+) to ([\d.]+) for seed 0 \(([+-][\d.]+) points; the mean "
                  r"gain of (\w+) seeds is ([+-][\d.]+)\)", text)
    assert m, "the README quotes seed 0's curve and the mean gain of the sync seeds"
    first, last, gain, count, mean = m.groups()
    runs = json.loads((ROOT / "benchmarks" / "results" / "quickstart.json").read_text())
    words = {"two": 2, "three": 3, "four": 4, "five": 5}
    for cpu in {r["cpu"] for r in runs}:
        sync = [r for r in runs if r["cpu"] == cpu and r["mode"] == "sync"]
        gains = {}
        for r in sync:
            curve = sorted((int(k), v) for k, v in r["val_success"].items())
            gains[r["seed"]] = (curve[0][1], curve[-1][1], 100 * (curve[-1][1] - curve[0][1]))
        if 0 not in gains or len(gains) != words.get(count):
            continue
        f0, l0, g0 = gains[0]
        avg = sum(g for _, _, g in gains.values()) / len(gains)
        if (f"{f0:.3f}", f"{l0:.3f}", f"{g0:+.1f}", f"{avg:+.1f}") == (first, last, gain, mean):
            return
    raise AssertionError(f"no CPU's sync runs in quickstart.json give {m.group(0)!r}")
