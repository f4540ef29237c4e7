"""``toolrl eval`` needs only what evaluation uses (no ``data.train_file``); a config asking for
GPUs on a machine without any is one line that says so and names the CPU overrides; a task file
that does not exist is one line naming its key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from toolrl.envs.function_calling import FunctionCallingEnv

from toolrl.cli import main
from toolrl.trainer.context import RunContext

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """\
experiment_name: eval_needs
env: {id: toolrl/FunctionCalling-v0}
data: {train_file: data/never_converted_train.jsonl, val_file: VAL}
rollout: {max_turns: 1, max_tokens_per_turn: 64, max_total_tokens: 640, max_prompt_tokens: 512,
          engine: {max_model_len: 640}}
reward: {rewards: [{name: bfcl_ast}]}
"""


class ReachedWorkers(Exception):
    """Eval got past every check: it would start its rollout workers now."""


def test_eval_needs_no_train_file_and_train_names_the_key(tmp_path, tiny_model_dir,
                                                         monkeypatch, capsys):
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps(r) + "\n" for r in FunctionCallingEnv.make_tasks(3)))
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.replace("VAL", str(val)))
    overrides = [f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path / 'run'}"]
    code = main(["train", "--config", str(config), *overrides])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "data.train_file='data/never_converted_train.jsonl': the task file does not exist" \
        in err

    def stop(self, *args, **kwargs):
        raise ReachedWorkers

    monkeypatch.setattr(RunContext, "start_rollout", stop)
    with pytest.raises(ReachedWorkers):
        main(["eval", "--config", str(config), "--model", str(tiny_model_dir), "--output-dir",
              str(tmp_path / "eval"), *overrides])


def test_a_gpu_config_on_a_machine_without_gpus_names_the_cpu_overrides(tmp_path, capsys,
                                                                        tiny_model_dir,
                                                                        monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU box, too
    code = main(["eval", "--config", str(ROOT / "configs" / "toolrl_paper.yaml"), "--model",
                 str(tiny_model_dir), "--output-dir", str(tmp_path / "eval")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "asks for GPUs (resources.device=cuda, rollout.engine.backend=gpu)" in err
    for override in ("resources.device=cpu", "rollout.engine.backend=cpu",
                     "resources.processes_per_node=1"):
        assert override in err
    assert "process_on_nodes" not in err


def test_eval_trials_play_every_row_that_many_times(tmp_path, tiny_model_dir, monkeypatch,
                                                     capsys):
    """``--trials K`` (tau2's pass^k needs K episodes of each task): K samples of every
    validation row; below 1 it is one line."""
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps(r) + "\n" for r in FunctionCallingEnv.make_tasks(3)))
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.replace("VAL", str(val)))
    args = ["eval", "--config", str(config), "--model", str(tiny_model_dir), "--output-dir",
            str(tmp_path / "eval"), f"trainer.output_dir={tmp_path / 'run'}"]
    assert main([*args, "--trials", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--trials must be >= 1, got 0" in err, err
    asked = []

    def rollout(self, rows, n, seed, greedy=False, uids=None):
        asked.append((len(rows), n))
        raise ReachedWorkers

    monkeypatch.setattr(RunContext, "start_rollout", lambda self: None)
    monkeypatch.setattr(RunContext, "rollout", rollout)
    with pytest.raises(ReachedWorkers):
        main([*args, "--trials", "4"])
    assert asked == [(3, 4)]
