"""examples/custom_reward: pip-install the third-party package (into a temporary target, so the
shared environment is untouched) and use its reward by id from a YAML config; toolrl finds it
only through the `toolrl.rewards` entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "custom_reward"

SCRIPT = r"""
import json, sys
from omegaconf import OmegaConf
from toolrl.core.trajectory import Trajectory
from toolrl.reward import REWARDS, build_reward

cfg = OmegaConf.load(sys.argv[1])
tools = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
row = {"category": "simple", "ground_truth": [{"f": {"a": [1]}}]}
trajs = []
for i, (a, text) in enumerate([(1, "All done, thanks!"), (2, "done"), (1, "ok")]):
    t = Trajectory.from_calls([{"name": "f", "arguments": {"a": a}}], {**row, "id": i}, tools)
    t.messages.append({"role": "assistant", "content": text})
    trajs.append(t)
loaded_before = "toolrl_custom_reward" in sys.modules
with build_reward(cfg.reward) as fn:
    out = fn.score(trajs)
print(json.dumps({"scores": out.scores, "metrics": out.metrics(),
                  "loaded_before": loaded_before,
                  "module": sys.modules["toolrl_custom_reward"].__file__,
                  "names": REWARDS.names()}))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The example package installed with pip into a private target directory."""
    tmp = tmp_path_factory.mktemp("custom_reward")
    src = tmp / "src"
    shutil.copytree(EXAMPLE, src)  # pip builds in-tree: keep build/ out of the repository
    target = tmp / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                          "--no-build-isolation", "--quiet", "--target", str(target), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return target


def run(site, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_installed_plugin_is_listed(site):
    res = run(site, "-m", "toolrl.cli", "rewards")
    assert res.returncode == 0, res.stderr
    names = [line.split()[0] for line in res.stdout.splitlines()]
    assert "keyword_bonus" in names and "bfcl_ast" in names


def test_installed_plugin_used_from_a_yaml_config(site, tmp_path):
    script = tmp_path / "score.py"
    script.write_text(SCRIPT)
    res = run(site, str(script), str(EXAMPLE / "reward.yaml"))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert not out["loaded_before"]  # nothing imported it by name: the entry point did
    assert out["module"].startswith(str(site))
    # a=1 right + "done" and "thanks" -> 1 + 0.5, clipped at 1.25; a=2 wrong: the bonus is gated
    # off; a=1 right without keywords -> 1.0
    assert out["scores"] == [1.25, 0.0, 1.0]
    m = out["metrics"]
    assert m["reward/keyword_bonus"] == pytest.approx((0.5 + 0.25 + 0.0) / 3)
    assert m["reward/keyword_bonus/found"] == pytest.approx(1.0)
    assert m["reward/gate_open/keyword_bonus"] == pytest.approx(2 / 3)
    assert m["reward/errors/keyword_bonus"] == 0.0


def test_plugin_is_absent_without_the_package():
    res = subprocess.run([sys.executable, "-m", "toolrl.cli", "rewards"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and "keyword_bonus" not in res.stdout
