"""`toolrl eval` never scores a benchmark over only the rows that fit: a row whose first prompt is
over ``rollout.max_prompt_tokens`` (kept with ``data.overlong_prompts=filter``, which in
training drops it) is not played and counts as a failed episode, in BFCL's figures too, as BFCL
counts an entry the model could not take. The real-model recipe's evaluation had left 72 of
1,974 BFCL rows out this way (57 of them live_multiple's)."""

from __future__ import annotations

import json

import torch
from toolrl.envs.function_calling import FunctionCallingEnv

from toolrl import batch as B
from toolrl.cli import main
from toolrl.trainer.context import RunContext

CONFIG = """\
experiment_name: eval_over_budget
env: {id: toolrl/FunctionCalling-v0}
data: {val_file: VAL, overlong_prompts: filter}
rollout: {max_turns: 1, max_tokens_per_turn: 64, max_total_tokens: 640, max_prompt_tokens: 512,
          engine: {max_model_len: 640}}
reward: {rewards: [{name: bfcl_ast}]}
"""


def test_rows_over_the_prompt_budget_count_as_failed_episodes(tmp_path, tiny_model_dir,
                                                              monkeypatch):
    rows = FunctionCallingEnv.make_tasks(4)
    for i, row in enumerate(rows):
        row.update(id=f"simple_python_{i}", source="bfcl", category="simple_python")
        row["messages"][0]["content"] = f"Question {i}: a reminder nobody trains on."
    rows[2]["messages"][0]["content"] = "Please remind me. " * 300  # ~1,200 tokens
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.replace("VAL", str(val)))
    played = []

    def rollout(self, rows, n, seed, greedy=False, uids=None):  # every played episode wins
        from toolrl.core.trajectory import Trajectory

        played.extend(r["id"] for r in rows)
        trajs = [Trajectory(row=dict(r), success=True) for r in rows for _ in range(n)]
        return B.build_rollout_batch([[1, 2]] * len(trajs), [[3]] * len(trajs),
                                     [[1]] * len(trajs), pad_token_id=0,
                                     non_tensor={B.TRAJECTORIES: trajs})

    def score(self, batch):
        batch[B.TOKEN_LEVEL_SCORES] = torch.ones(batch.batch_size[0], 1)

    monkeypatch.setattr(RunContext, "start_rollout", lambda self: None)
    monkeypatch.setattr(RunContext, "rollout", rollout)
    monkeypatch.setattr(RunContext, "score", score)
    out = tmp_path / "eval"
    assert main(["eval", "--config", str(config), "--model", str(tiny_model_dir),
                 "--output-dir", str(out), "--save-transcripts",
                 f"trainer.output_dir={tmp_path / 'run'}"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert played == ["simple_python_0", "simple_python_1", "simple_python_3"]
    assert results["over_budget"] == 1 and results["num_tasks"] == 4
    assert results["engine_dtype"] == "float32"  # what the engine ran in: the CPU default
    assert results["success"] == 0.75 and results["reward_mean"] == 0.75
    assert results["bfcl"]["per_category"]["simple_python"] == {
        "correct": 3, "n": 4, "accuracy": 0.75}
    lines = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    unplayed = [t for t in lines if t["row"]["id"] == "simple_python_2"]
    assert len(unplayed) == 1 and unplayed[0]["finish_reason"] == "context"
    assert unplayed[0]["reward"] == 0.0 and "not played" in unplayed[0]["error"]
