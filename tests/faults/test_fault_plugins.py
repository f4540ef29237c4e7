"""Fault table, plugins: a third-party plugin that fails to import fails alone.

Two distributions are put on the path exactly as pip would leave them (a ``*.dist-info`` with
``entry_points.txt``): a good one (an env id and a reward) and a broken one whose env and
reward modules raise at import. Expected: ``toolrl envs`` / ``rewards`` list every good env
and reward (built-ins and the good plugin's) and name the broken plugin with its error, one
line each on stderr (exit 1); ``toolrl check-env`` passes a good env (naming the broken plugin
beside it) and, for the broken plugin's id, fails naming the import error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def dist(site: Path, name: str, entry_points: str, modules: dict[str, str]) -> None:
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    for module, text in modules.items():
        (site / f"{module}.py").write_text(text)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    dist(site, "acme_good", "[toolrl.envs]\nacme_good = acme_good_envs\n"
         "[toolrl.rewards]\nacme_good = acme_good_rewards\n", {
             "acme_good_envs": "from toolrl import register_env\n"
                               "register_env('acme/Calc-v0', "
                               "'toolrl.envs.calculator:CalculatorEnv')\n",
             "acme_good_rewards": "from toolrl import reward\n\n"
                                  "@reward('acme_short')\n"
                                  "def short(traj) -> float:\n"
                                  "    '''1 for an episode of one turn.'''\n"
                                  "    return float(len(traj.turns) == 1)\n"})
    dist(site, "acme_broken", "[toolrl.envs]\nacme/Shop-v0 = acme_broken_envs:ShopEnv\n"
         "[toolrl.rewards]\nacme_broken = acme_broken_rewards\n", {
             "acme_broken_envs": "import acme_missing_dependency\n",
             "acme_broken_rewards": "raise RuntimeError('reward plugin exploded')\n"})
    return site


def toolrl(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site),
                                                        os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "toolrl.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)


def test_envs_lists_the_good_ones_and_names_the_broken_one(site):
    out = toolrl(site, "envs")
    assert out.returncode == 1, out.stderr
    assert "toolrl/Calculator-v0" in out.stdout and "acme/Calc-v0" in out.stdout
    lines = out.stderr.strip().splitlines()
    assert lines == [line for line in lines if line.startswith("broken plugin: ")], out.stderr
    assert len(lines) == 1 and "'acme/Shop-v0'" in lines[0] and "acme_broken" in lines[0]
    assert "No module named 'acme_missing_dependency'" in lines[0]


def test_rewards_lists_the_good_ones_and_names_the_broken_one(site):
    out = toolrl(site, "rewards")
    assert out.returncode == 1, out.stderr
    assert "success" in out.stdout and "acme_short" in out.stdout
    assert out.stderr.count("broken plugin: ") == 1
    assert "'acme_broken'" in out.stderr and "RuntimeError: reward plugin exploded" in out.stderr


def test_check_env_of_a_good_env_passes_beside_a_broken_plugin(site):
    out = toolrl(site, "check-env", "toolrl/Calculator-v0")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS" in out.stdout and "acme_missing_dependency" in out.stderr
    out = toolrl(site, "check-env", "acme/Shop-v0")
    assert out.returncode == 1 and "FAIL" in out.stdout
    assert "No module named 'acme_missing_dependency'" in out.stdout
