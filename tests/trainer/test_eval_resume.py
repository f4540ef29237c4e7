"""A cut-off `toolrl eval` goes on where it stopped: each finished chunk of episodes is journaled
in the output folder, the same command replays only the missing chunks, and its results are the
uninterrupted run's. The real-model recipe's BFCL evaluations take 31 minutes each and its
multi-turn ones hours, on 2 cores: a session that ends mid-evaluation must not cost all of it."""

from __future__ import annotations

import json

import pytest
import torch
from toolrl.envs.function_calling import FunctionCallingEnv

from toolrl import batch as B
from toolrl.cli import main
from toolrl.trainer.context import RunContext
from toolrl.trainer.evaluate import JOURNAL

CONFIG = """\
experiment_name: eval_resume
env: {id: toolrl/FunctionCalling-v0}
data: {val_file: VAL}
rollout: {max_turns: 1, max_tokens_per_turn: 32, max_total_tokens: 640, max_prompt_tokens: 512,
          concurrency: 1, engine: {max_model_len: 640}}
reward: {rewards: [{name: bfcl_ast}]}
"""


def _setup(tmp_path, n=20):
    rows = FunctionCallingEnv.make_tasks(n)
    for i, row in enumerate(rows):
        row.update(id=f"simple_python_{i}", source="bfcl", category="simple_python")
        row["messages"][0]["content"] = f"Question {i}: a reminder nobody trains on."
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.replace("VAL", str(val)))
    return config


@pytest.fixture
def fake_engine(monkeypatch):
    """Rollout and scoring without workers: an episode succeeds on rows whose number is a
    multiple of 3; ``played`` lists the rows each call played, ``stop_at`` the call that is
    interrupted (as Ctrl-C or a killed session would)."""
    from toolrl.core.trajectory import Trajectory

    state = {"played": [], "stop_at": None}

    def rollout(self, rows, n, seed, greedy=False, uids=None):
        if state["stop_at"] == len(state["played"]):
            raise KeyboardInterrupt
        state["played"].append([r["id"] for r in rows])
        trajs = [Trajectory(row=dict(r), success=int(r["id"].rsplit("_", 1)[1]) % 3 == 0,
                            prompt_tokens=10, response_tokens=2, seed=seed)
                 for r in rows for _ in range(n)]
        return B.build_rollout_batch([[1, 2]] * len(trajs), [[3]] * len(trajs),
                                     [[1]] * len(trajs), pad_token_id=0,
                                     non_tensor={B.TRAJECTORIES: trajs})

    def score(self, batch):
        wins = [t.success for t in B.trajectories(batch)]
        batch[B.TOKEN_LEVEL_SCORES] = torch.tensor(wins, dtype=torch.float32)[:, None]

    monkeypatch.setattr(RunContext, "start_rollout", lambda self: None)
    monkeypatch.setattr(RunContext, "rollout", rollout)
    monkeypatch.setattr(RunContext, "score", score)
    return state


def _eval(config, model, out, *extra):
    return main(["eval", "--config", str(config), "--model", str(model), "--output-dir",
                 str(out), "--save-transcripts", f"trainer.output_dir={out.parent / 'run'}",
                 *extra])


def _same(a, b):
    """Results alike but for the wall time and where episodes came from."""
    drop = ("perf", "resumed_episodes")
    return {k: v for k, v in a.items() if k not in drop} == \
        {k: v for k, v in b.items() if k not in drop}


def test_a_cut_off_eval_replays_only_the_missing_chunks(tmp_path, tiny_model_dir,
                                                        fake_engine):
    config = _setup(tmp_path)
    whole = tmp_path / "whole"
    assert _eval(config, tiny_model_dir, whole) == 0
    assert [len(c) for c in fake_engine["played"]] == [8, 8, 4]  # chunks of 8 x concurrency
    expected = json.loads((whole / "results.json").read_text())
    assert expected["resumed_episodes"] == 0 and not (whole / JOURNAL).exists()

    fake_engine.update(played=[], stop_at=2)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        _eval(config, tiny_model_dir, cut)
    assert not (cut / "results.json").exists()
    lines = (cut / JOURNAL).read_text().splitlines()
    assert [json.loads(line).get("chunk") for line in lines] == [None, 0, 1]

    fake_engine.update(played=[], stop_at=None)
    assert _eval(config, tiny_model_dir, cut) == 0
    assert fake_engine["played"] == [[f"simple_python_{i}" for i in range(16, 20)]]
    results = json.loads((cut / "results.json").read_text())
    assert results["resumed_episodes"] == 16 and _same(results, expected)
    assert results["bfcl"]["per_category"]["simple_python"]["correct"] == 7
    assert not (cut / JOURNAL).exists()
    # every episode in order, with the seed its chunk would have had uninterrupted
    saved = [json.loads(line) for line in (cut / "transcripts.jsonl").read_text().splitlines()]
    assert saved == [json.loads(line) for line in
                     (whole / "transcripts.jsonl").read_text().splitlines()]


def test_a_journal_of_another_evaluation_is_not_resumed(tmp_path, tiny_model_dir, fake_engine,
                                                        capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # the log line unwrapped
    config = _setup(tmp_path)
    out = tmp_path / "eval"
    fake_engine["stop_at"] = 2
    with pytest.raises(KeyboardInterrupt):
        _eval(config, tiny_model_dir, out)
    fake_engine.update(played=[], stop_at=None)
    assert _eval(config, tiny_model_dir, out, "rollout.max_tokens_per_turn=16") == 0
    assert [len(c) for c in fake_engine["played"]] == [8, 8, 4]
    assert "another evaluation's episodes" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["resumed_episodes"] == 0


def test_a_chunk_cut_off_while_written_is_played_again(tmp_path, tiny_model_dir, fake_engine):
    config = _setup(tmp_path)
    out = tmp_path / "eval"
    fake_engine["stop_at"] = 2
    with pytest.raises(KeyboardInterrupt):
        _eval(config, tiny_model_dir, out)
    journal = out / JOURNAL
    text = journal.read_text()
    journal.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])  # half a line
    fake_engine.update(played=[], stop_at=None)
    assert _eval(config, tiny_model_dir, out) == 0
    assert [len(c) for c in fake_engine["played"]] == [8, 4]
    assert json.loads((out / "results.json").read_text())["resumed_episodes"] == 8


@pytest.mark.e2e
@pytest.mark.slow
def test_a_real_engines_eval_cut_off_and_resumed_scores_as_the_uninterrupted_one(
        ray_cluster, tiny_model_dir, tmp_path, monkeypatch):
    """The real stack (Ray, the vLLM CPU engine, the tiny model), greedy: stopped after its
    first chunk and run again, the evaluation's episodes and results are the uninterrupted
    run's, and only the second chunk was played again."""
    config = _setup(tmp_path, n=12)
    whole = tmp_path / "whole"
    assert _eval(config, tiny_model_dir, whole) == 0
    real = RunContext.rollout
    calls = []

    def rollout(self, rows, n, seed, greedy=False, uids=None):
        calls.append(len(rows))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, rows, n, seed, greedy=greedy, uids=uids)

    monkeypatch.setattr(RunContext, "rollout", rollout)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        _eval(config, tiny_model_dir, cut)
    calls.clear()
    assert _eval(config, tiny_model_dir, cut) == 0
    assert calls == [4]
    results = json.loads((cut / "results.json").read_text())
    assert results["resumed_episodes"] == 8
    assert _same(results, json.loads((whole / "results.json").read_text()))

    def episodes(out):
        return [{k: d[k] for k in ("row", "messages", "reward", "success")}
                for d in map(json.loads, (out / "transcripts.jsonl").read_text().splitlines())]

    assert episodes(cut) == episodes(whole)
