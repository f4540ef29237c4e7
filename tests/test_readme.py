"""The README's "Your own environment, end to end" section, run verbatim: its code blocks are
extracted and executed in order in an empty directory (a block whose first line is ``# FILE``
goes into that file; other Python blocks run as scripts; each shell line runs as it is), with
this interpreter's ``toolrl`` and ``pip`` first on PATH. The package it installs is uninstalled
afterwards."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Your own environment, end to end"
DIST = "weather-env"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def section_blocks(readme: str, heading: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block between ``heading`` and the next ``## ``."""
    start = readme.index(heading + "\n")
    end = readme.find("\n## ", start + len(heading))
    return FENCE.findall(readme[start:end if end >= 0 else None])


def test_blocks_are_found():
    text = "## A\n```python\nx = 1\n```\n```bash\nls\n```\n## B\n```python\ny\n```\n"
    assert section_blocks(text, "## A") == [("python", "x = 1\n"), ("bash", "ls\n")]


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def workdir(tmp_path):
    try:
        yield tmp_path
    finally:
        pip("uninstall", "--yes", "--quiet", DIST)


@pytest.mark.timeout(900)
def test_custom_env_section_runs_verbatim(workdir):
    blocks = section_blocks((ROOT / "README.md").read_text(encoding="utf-8"), SECTION)
    assert {lang for lang, _ in blocks} == {"python", "toml", "yaml", "bash"}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "COLUMNS": "160", "PYTHONPATH": ""}
    outputs = []
    for i, (lang, code) in enumerate(blocks):
        first = code.splitlines()[0]
        target = re.fullmatch(r"# ([\w.]+\.(py|toml|yaml))", first)
        if target:
            path = workdir / target.group(1)
            before = path.read_text(encoding="utf-8") + "\n\n" if path.exists() else ""
            path.write_text(before + code, encoding="utf-8")  # a second block continues it
            continue
        if lang == "python":
            script = workdir / f"_readme_block_{i}.py"
            script.write_text(code, encoding="utf-8")
            commands = [[sys.executable, script.name]]
        elif lang == "bash":
            commands = [["bash", "-c", line] for line in code.splitlines()
                        if line.strip() and not line.lstrip().startswith("#")]
        else:
            raise AssertionError(f"block {i} ({lang}) has no '# FILE' line and does not run")
        for command in commands:
            run = subprocess.run(command, cwd=workdir, capture_output=True, text=True,
                                 timeout=300, env=env)
            assert run.returncode == 0, (f"README block {i}: {command[-1]} exited "
                                         f"{run.returncode}\n{run.stdout[-3000:]}\n"
                                         f"{run.stderr[-3000:]}")
            outputs.append((command[-1], run.stdout))
    printed = dict(outputs)
    assert "PASS" in printed["toolrl check-env my/Weather-v0 --max-turns 3"]
    dry = printed["toolrl train --config weather.yaml --dry-run"]
    assert "first prompts (with tools)" in dry and "weather_efficient" in dry
    assert "no problems found" in dry
    scores = [json.loads(line) for line in (workdir / "scores.jsonl").read_text().splitlines()]
    assert [s["score"] for s in scores] == [1.0] * 4  # the oracle: right, after one call
    assert all(s["components"]["weather_efficient/calls"] == 1.0 for s in scores)
