"""examples/custom_env: a third-party package registers an env through the entry point."""

from __future__ import annotations

import json
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
