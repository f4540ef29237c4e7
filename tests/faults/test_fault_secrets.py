"""Secrets: values of environment variables that look like keys or tokens never reach the run
directory: metrics.jsonl, rollouts/*.jsonl, TensorBoard events, plots, the console log,
config.yaml, or a checkpoint directory.

A canary value is set as ``MY_API_KEY`` and then pushed through every path that writes: string
metrics (and a metric name), rollout records with the canary in messages, tool output and
errors, console messages, a config that interpolates it (``${oc.env:MY_API_KEY}``), and a
checkpoint (DCP model + optimizer shards and trainer state). Then every byte of every file is
searched for the canary. The same run checks that redaction does not wipe everything else.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from rich.console import Console

from toolrl.data import TaskLoader
from toolrl.trainer import checkpoint as ckpt
from toolrl.trainer.config import load_config, save_config
from toolrl.trainer.tracking import Tracker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def canary(monkeypatch):
    value = f"sk-canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("MY_API_KEY", value)
    monkeypatch.setenv("SERVICE_TOKEN", value[::-1])
    return value


def files_containing(root: Path, needles: list[str]) -> list[str]:
    """Every file under ``root`` whose bytes contain one of the needles (raw or escaped)."""
    found = []
    encoded = [n.encode() for n in needles]
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if any(n in data for n in encoded):
                found.append(str(path.relative_to(root)))
    assert any(root.rglob("*")), "nothing was written"
    return found


def test_secrets_never_reach_tracker_outputs(tmp_path, canary):
    console_log = tmp_path / "console.log"
    with console_log.open("w") as fh:
        tracker = Tracker(tmp_path / "run", "secrets", config={"env": {"api_key": canary}},
                          total_steps=2, console=Console(file=fh, width=200))
        tracker.log(1, {"train/reward_mean": 0.5, "train/success": 1.0,
                        "debug/last_error": f"HTTP 401: bad key {canary}",
                        f"tool/{canary}/calls": 3.0})
        tracker.log_rollouts(1, [{
            "task_id": "t1", "messages": [
                {"role": "user", "content": f"my key is {canary}"},
                {"role": "tool", "name": "http", "content": f'{{"token": "{canary[::-1]}"}}'}],
            "turns": [{"errors": [{"type": "http_error", "message": f"Bearer {canary}"}]}],
            canary: canary}])
        tracker.print(f"episode failed: Authorization: Bearer {canary}")
        tracker.log(2, {"train/reward_mean": 0.75, "train/success": 0.0})
        tracker.close()
    assert files_containing(tmp_path, [canary, canary[::-1]]) == []
    # redaction keeps everything else
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert '"train/reward_mean": 0.75' in metrics and "HTTP 401: bad key ***" in metrics
    assert "my key is ***" in (tmp_path / "run" / "rollouts" / "step_1.jsonl").read_text()
    assert "Authorization: Bearer ***" in console_log.read_text()
    assert list((tmp_path / "run" / "tensorboard").iterdir())
    assert (tmp_path / "run" / "plots" / "reward.png").exists()


def test_secrets_never_reach_config_yaml(tmp_path, canary):
    """A config may read a key from the environment; the resolved config.yaml in the run
    directory shows it redacted, while the loaded config holds the real value."""
    path = tmp_path / "exp.yaml"
    path.write_text("env:\n  id: toolrl/HttpApi-v0\n  kwargs:\n"
                    "    api_key: ${oc.env:MY_API_KEY}\n    base_url: http://127.0.0.1:1\n")
    cfg = load_config(path)
    assert cfg.env.kwargs["api_key"] == canary
    (tmp_path / "run").mkdir()
    save_config(cfg, tmp_path / "run" / "config.yaml")
    assert files_containing(tmp_path / "run", [canary]) == []
    saved = load_config(tmp_path / "run" / "config.yaml")
    assert saved.env.kwargs["api_key"] == "***" and saved.env.id == "toolrl/HttpApi-v0"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_secrets_never_reach_a_checkpoint(tmp_path, canary):
    """A checkpoint written the way the trainer writes one: DCP shards of the model and its
    optimizer, the trainer state (step, data position, RNG), the COMPLETE marker."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    loader = TaskLoader([{"id": f"t{i}", "question": "q"} for i in range(8)], 4, seed=0)
    loader.next_batch()
    root = tmp_path / "checkpoints"
    with ckpt.atomic_checkpoint(root, 3, keep=2) as d:
        dcp.save({"model": model.state_dict(), "optim": opt.state_dict()},
                 checkpoint_id=str(d / "actor"))
        ckpt.save_trainer_state(d, {"step": 3, "data": loader.state_dict()})
    assert ckpt.latest_checkpoint(root) == root / "step_3"
    assert len(list((root / "step_3" / "actor").iterdir())) >= 2
    assert files_containing(root, [canary, canary[::-1]]) == []
    assert ckpt.load_trainer_state(root / "step_3")["step"] == 3
