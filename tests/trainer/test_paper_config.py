"""configs/toolrl_paper.yaml (the ToolRL paper's GPU setup) dry-run on CPU with the tiny model:
only the device, the model and the sizes are overridden; everything else runs as configured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from trainer_runs import run_training_in_process

from toolrl.data.convert import convert

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FORMATS = Path(__file__).parents[1] / "data" / "formats"


def test_paper_config_dry_run_on_cpu(ray_cluster, tiny_model_dir, tmp_path):
    data = tmp_path / "data"
    for fmt in ("toolace", "xlam"):  # the paper's sources, converted as the config says
        report = convert(fmt, [FORMATS / f"{fmt}.json"], data / f"{fmt}.jsonl")
        assert report.written
    train = data / "train.jsonl"
    train.write_text((data / "toolace.jsonl").read_text() + (data / "xlam.jsonl").read_text())
    cpu = {
        "model.path": tiny_model_dir, "trainer.output_dir": tmp_path / "paper",
        "resources.device": "cpu", "resources.processes_per_node": 1,
        "resources.ray_num_cpus": 8, "rollout.engine.backend": "cpu",
        "rollout.engine.multiprocessing": False,  # as small_run_overrides: a faster start
        "rollout.engine.dtype": "float32", "rollout.engine.gpu_memory_utilization": 0.1,
        "actor.param_dtype": "null", "data.train_file": train,
        "data.val_file": data / "xlam.jsonl", "rollout.engine.max_model_len": 768,
        "rollout.max_total_tokens": 768, "rollout.max_prompt_tokens": 640,
        "rollout.max_tokens_per_turn": 32, "rollout.concurrency": 16,
        "data.batch_size": 2, "actor.ppo_mini_batch_size": 4, "trainer.total_steps": 1,
    }
    rows = run_training_in_process([f"{k}={v}" for k, v in cpu.items()],
                                   config="configs/toolrl_paper.yaml")
    assert [r["step"] for r in rows] == [0, 1]
    step = rows[1]
    assert -3.0 <= step["reward/toolcall_fine"] <= 4.0  # correctness [-3, 3] + format {0, 1}
    assert "reward/toolcall_fine/correct" in step and "reward/toolcall_fine/format" in step
    assert step["kl_coef"] == pytest.approx(0.001)  # in-reward KL to the reference
    assert "val/success" in rows[0] and "val/success" in step
    resolved = yaml.safe_load((tmp_path / "paper" / "config.yaml").read_text())
    paper = yaml.safe_load(Path("configs/toolrl_paper.yaml").read_text())
    for section, key in (("algorithm", "group_size"), ("algorithm", "kl_in_reward_coef"),
                         ("actor", "lr"), ("actor", "gradient_checkpointing"),
                         ("actor", "use_remove_padding"), ("rollout", "temperature")):
        assert resolved[section][key] == paper[section][key], (section, key)
    assert resolved["actor"]["loss"] == {**resolved["actor"]["loss"], **paper["actor"]["loss"]}
    # the saved config writes every key of the typed reward entries; the paper's are kept
    assert holds(resolved["reward"], paper["reward"]), (resolved["reward"], paper["reward"])
    assert (tmp_path / "paper" / "final_hf" / "config.json").exists()


def holds(got: Any, want: Any) -> bool:
    """``got`` has every key of ``want`` with its value (lists item by item, same length)."""
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and holds(got[k], v)
                                             for k, v in want.items())
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(
            holds(g, w) for g, w in zip(got, want, strict=True))
    return got == want
