"""Checkpoint directories are atomic: a killed save never becomes the resume point."""

from __future__ import annotations

import random

import pytest
import torch

from toolrl.trainer.checkpoint import (
    atomic_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_trainer_state,
    save_trainer_state,
)


def test_complete_checkpoints_only(tmp_path):
    for step in (1, 2):
        with atomic_checkpoint(tmp_path, step) as d:
            (d / "payload").write_text(str(step))
    with pytest.raises(RuntimeError), atomic_checkpoint(tmp_path, 3) as d:
        (d / "payload").write_text("half")
        raise RuntimeError("killed midway")
    # a save interrupted without cleanup (SIGKILL) leaves only a temp dir
    (tmp_path / ".tmp-step_4").mkdir()
    (tmp_path / "step_5").mkdir()  # no COMPLETE marker
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 2]
    assert (latest_checkpoint(tmp_path) / "payload").read_text() == "2"
    assert not (tmp_path / ".tmp-step_3").exists()


def test_keep_prunes_old_checkpoints(tmp_path):
    for step in range(1, 5):
        with atomic_checkpoint(tmp_path, step, keep=2):
            pass
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]


def test_trainer_state_restores_rng(tmp_path):
    random.seed(1)
    torch.manual_seed(1)
    save_trainer_state(tmp_path, {"step": 7, "data": {"epoch": 1, "index": 3}})
    expected = (random.random(), torch.rand(3))
    random.seed(99)
    torch.manual_seed(99)
    state = load_trainer_state(tmp_path)
    assert state["step"] == 7 and state["data"] == {"epoch": 1, "index": 3}
    got = (random.random(), torch.rand(3))
    assert got[0] == expected[0] and torch.equal(got[1], expected[1])
