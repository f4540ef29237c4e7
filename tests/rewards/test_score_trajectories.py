"""`toolrl score`: saved trajectories (rollout dumps) scored offline with any reward or a
config's reward section, through the training code path."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import toolrl
from toolrl.cli import main

ROOT = Path(__file__).resolve().parents[2]


@toolrl.reward("score_test_boom")
def boom(traj: toolrl.Trajectory) -> float:
    """Raises on failed episodes only."""
    if not traj.success:
        raise ValueError("cannot score a failure")
    return 1.0


def no_call(env, messages):
    return "I do not know."


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    """A rollout dump as the trainer writes it: ``{"reward": s, **traj.to_dict()}`` per line;
    two oracle episodes (success) and one that answers without a call (failure)."""
    env = toolrl.make_env("toolrl/Calculator-v0")
    trajs = [asyncio.run(toolrl.run_episode(env, seed=s)) for s in (0, 1)]
    trajs.append(asyncio.run(toolrl.run_episode(env, no_call, seed=2)))
    env.close()
    path = tmp_path_factory.mktemp("dump") / "step_1.jsonl"
    path.write_text("".join(json.dumps({"reward": 0.25, **t.to_dict()}) + "\n" for t in trajs))
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_scores_a_dump_with_a_reward_id(dump, tmp_path, capsys):
    out = tmp_path / "scores.jsonl"
    assert main(["score", str(dump), "--reward", "success", "--output", str(out)]) == 0
    got = lines(out)
    assert [g["score"] for g in got] == [1.0, 1.0, 0.0]
    assert [g["components"] for g in got] == [{"success": 1.0}, {"success": 1.0},
                                              {"success": 0.0}]
    assert all(g["saved_reward"] == 0.25 and g["errors"] == [] for g in got)
    assert got[0]["id"] == json.loads(dump.read_text().splitlines()[0])["row"]["id"]
    text = capsys.readouterr().out
    assert "3 trajectories" in text and "0.6667" in text and "0.2500" in text


def test_reward_kwargs_and_failures_are_reported_per_line(dump, tmp_path, capsys):
    out = tmp_path / "scores.jsonl"
    assert main(["score", str(dump), "--reward", "turn_penalty", "--kwargs",
                 '{"penalty": 0.5, "free_turns": 0}', "--output", str(out)]) == 0
    assert [g["score"] for g in lines(out)] == [-1.0, -1.0, -0.5]  # 2, 2 and 1 turns
    assert main(["score", str(dump), "--reward", "score_test_boom", "--output", str(out)]) == 0
    got = lines(out)
    assert got[0]["errors"] == [] and got[2]["errors"] == [
        "score_test_boom: ValueError: cannot score a failure (at test_score_trajectories.py:22 "
        "in boom)"]  # where it was raised, as on the training console
    assert main(["score", str(dump), "--reward", "success", "--kwargs", '{"nope": 1}']) == 2
    assert "nope" in capsys.readouterr().err


def test_scores_with_a_config_reward_section(dump, tmp_path):
    out = tmp_path / "scores.jsonl"
    assert main(["score", str(dump), "--config", str(ROOT / "configs" / "quickstart.yaml"),
                 "--output", str(out)]) == 0
    assert [g["score"] for g in lines(out)] == [1.0, 1.0, 0.0]


def test_a_line_that_is_no_trajectory_names_file_and_line(dump, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(dump.read_text().splitlines()[0] + "\n" + json.dumps({"task_id": 1}) + "\n")
    assert main(["score", str(bad), "--reward", "success"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: not a trajectory" in err and "task_id" in err
    assert main(["score", str(dump)]) == 2  # neither --reward nor --config
