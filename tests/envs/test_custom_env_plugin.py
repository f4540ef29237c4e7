"""examples/custom_env: a third-party package registers an env through the entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom_env"
DIST = "toolrl-custom-env"

EPISODE = """
import asyncio, json, toolrl
env = toolrl.make_env("custom/UnitConvert-v0")
episode = asyncio.run(toolrl.run_episode(env, seed=0))
print(json.dumps({"success": episode.success, "turns": len(episode.turns),
                  "ids": toolrl.env_ids()}))
env.close()
"""


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory):
    """pip-install a copy of the example (build files stay out of the repo); uninstall after."""
    copy = tmp_path_factory.mktemp("custom_env") / "custom_env"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("*.egg-info", "build"))
    done = pip("install", "--no-deps", "--no-build-isolation", "--quiet", str(copy))
    try:
        assert done.returncode == 0, done.stderr[-2000:]
        yield copy
    finally:
        pip("uninstall", "--yes", "--quiet", DIST)


@pytest.mark.timeout(600)
def test_installed_package_provides_an_env_by_id(installed_example):
    run = subprocess.run([sys.executable, "-c", EPISODE], capture_output=True, text=True,
                         timeout=120, cwd=installed_example.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["success"] and result["turns"] == 2
    assert "custom/UnitConvert-v0" in result["ids"] and "toolrl/Calculator-v0" in result["ids"]

    check = subprocess.run([sys.executable, "-m", "toolrl.cli", "check-env",
                            "custom/UnitConvert-v0"], capture_output=True, text=True,
                           timeout=120, cwd=installed_example.parent)
    assert check.returncode == 0 and "PASS" in check.stdout, check.stdout + check.stderr


@pytest.mark.timeout(600)
def test_dry_run_of_the_example_config(installed_example, tiny_model_dir):
    """``toolrl train --dry-run`` on examples/custom_env/config.yaml: prompt token counts and
    the oracle's reward, without Ray or vLLM."""
    run = subprocess.run([sys.executable, "-m", "toolrl.cli", "train", "--config",
                          str(EXAMPLE / "config.yaml"), "--dry-run",
                          f"model.path={tiny_model_dir}"], capture_output=True, text=True,
                         timeout=300, cwd=installed_example.parent,
                         env={**os.environ, "COLUMNS": "160"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    out = run.stdout
    assert "first prompts (with tools)" in out and "units-train-0-0" in out
    oracle = next(line for line in out.splitlines() if line.startswith("│ oracle")
                  and "terminated" not in line)  # the rewards table's row
    assert oracle.split("│")[-3].strip() == "1.100"  # success 1.0 + 0.1 x format 1.0
    assert "no problems found" in out
