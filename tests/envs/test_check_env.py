"""Every registered env passes `toolrl check-env` (gymnasium's check_env + toolrl's checks)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from toolrl.envs import BUILTIN_ENVS

from toolrl.core.checks import check_tool_env
from toolrl.core.registration import env_ids


def test_every_builtin_is_registered_through_the_entry_point():
    from importlib import metadata

    eps = {ep.name: ep.value for ep in metadata.entry_points(group="toolrl.envs")}
    assert eps.get("builtin") == "toolrl.envs"
    assert set(BUILTIN_ENVS) <= set(env_ids())


@pytest.mark.timeout(180)
@pytest.mark.parametrize("env_id", env_ids())
def test_check_env(env_id):
    report = check_tool_env(env_id)
    assert report.ok, str(report)
    assert {r.name for r in report.results} >= {
        "gymnasium check_env", "tool schemas", "scripted policy", "call round trip",
        "seeded determinism", "episode isolation"}


def test_check_env_catches_a_broken_env():
    """The checks can fail: a non-deterministic env with a wrong oracle is reported."""
    import random

    from toolrl.core.env import ToolEnv
    from toolrl.core.registration import register_env
    from toolrl.core.tools import tool

    class Flaky(ToolEnv):
        @classmethod
        def make_tasks(cls, n, seed=0, split="train", **kwargs):
            return [{"id": str(i), "question": f"q{random.random()}"} for i in range(n)]

        @tool(inline=True)
        def ping(self) -> str:
            """Ping."""
            return "pong"

        def oracle_action(self) -> str:
            return "I give up."

    register_env("test/Flaky-v0", Flaky)
    report = check_tool_env("test/Flaky-v0")
    failed = {r.name for r in report.failures()}
    assert not report.ok
    assert {"scripted policy", "seeded determinism"} <= failed


@pytest.mark.timeout(180)
def test_cli_envs_and_check_env():
    toolrl = [sys.executable, "-m", "toolrl.cli"]
    listing = subprocess.run([*toolrl, "envs"], capture_output=True, text=True, timeout=150)
    assert listing.returncode == 0, listing.stderr
    for env_id in BUILTIN_ENVS:
        assert env_id in listing.stdout
    assert "add, sub, mul, div, pow, submit" in listing.stdout
    ok = subprocess.run([*toolrl, "check-env", "toolrl/Calculator-v0"], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0 and "PASS" in ok.stdout, ok.stdout + ok.stderr
    bad = subprocess.run([*toolrl, "check-env", "toolrl/Nope-v0"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1 and "toolrl/Calculator-v0" in bad.stdout
