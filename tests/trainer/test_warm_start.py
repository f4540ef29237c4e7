"""The supervised warm start: oracle transcripts as rollout tokens, SFT, and its config wiring."""

from __future__ import annotations

import json
import re

import pytest
import torch
from toolrl.envs.calculator import CalculatorEnv
from trainer_runs import ROOT
from transformers import AutoModelForCausalLM, AutoTokenizer

from toolrl.core.types import ToolCall
from toolrl.trainer.config import ConfigError, load_config
from toolrl.trainer.preflight import check_task_files
from toolrl.trainer.trainer import Trainer
from toolrl.trainer.warm_start import (
    held_out_loss,
    hold_out,
    oracle_transcripts,
    sft,
    shared_prefix_batch,
)
from toolrl.workers.scoring import enable_scoring, score_responses

ROWS = CalculatorEnv.make_tasks(24, seed=3, difficulty=1, style="plain")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _actions(tokenizer, transcript) -> list[str]:
    """The decoded runs of loss-mask-1 tokens (each ends with eos)."""
    runs, run = [], []
    for tok, m in zip(transcript.input_ids, transcript.loss_mask, strict=True):
        if m:
            run.append(tok)
        elif run:
            runs.append(run)
            run = []
    runs += [run] if run else []
    assert all(r[-1] == tokenizer.eos_token_id for r in runs)
    return [tokenizer.decode(r[:-1]) for r in runs]


def test_transcripts_train_on_the_oracle_actions_only(tokenizer):
    transcripts = oracle_transcripts("toolrl/Calculator-v0", ROWS, tokenizer)
    assert len(transcripts) == len(ROWS)
    for row, t in zip(ROWS, transcripts, strict=True):
        actions = _actions(tokenizer, t)
        op, a, b = row["plan"][0]
        assert actions == [
            f'<tool_call>{{"name": "{op}", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>',
            f'<tool_call>{{"name": "submit", "arguments": {{"answer": '
            f'{json.dumps(row["ground_truth"])}}}}}</tool_call>']
        assert row["question"] in tokenizer.decode(t.input_ids)  # the prompt is not trained on
        assert row["question"] not in "".join(actions)


def test_env_kwargs_reach_the_oracle_env(tokenizer):
    plan = oracle_transcripts("toolrl/Calculator-v0", ROWS, tokenizer)
    noisy = oracle_transcripts("toolrl/Calculator-v0", ROWS, tokenizer, {"oracle": "random_op"})
    ops = [re.search(r'"name": "(\w+)"', _actions(tokenizer, t)[0])[1] for t in noisy]
    assert ops != [row["plan"][0][0] for row in ROWS]
    assert [t.input_ids for t in noisy] != [t.input_ids for t in plan]
    with pytest.raises(ValueError, match="oracle"):
        oracle_transcripts("toolrl/Calculator-v0", ROWS, tokenizer, {"oracle": "nope"})


def test_too_long_transcripts_are_dropped(tokenizer):
    assert oracle_transcripts("toolrl/Calculator-v0", ROWS, tokenizer, max_len=32) == []
    with pytest.raises(ValueError, match="no oracle transcripts"):
        sft("unused", [], "unused")


def test_sft_lowers_the_loss_and_writes_a_loadable_checkpoint(tiny_model_dir, tokenizer,
                                                             tmp_path):
    transcripts = oracle_transcripts("toolrl/Calculator-v0", ROWS, tokenizer)
    metrics = sft(tiny_model_dir, transcripts, tmp_path / "ws", steps=30, batch_size=4,
                  warmup_steps=5)
    assert metrics["warm_start/loss_last"] < 0.5 * metrics["warm_start/loss_first"]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ws")
    # the compute account: 6 N per token (forward and backward) plus attention's share
    params = sum(p.numel() for p in model.parameters())
    assert 6 * params < metrics["warm_start/flop_per_token"] < 7 * params
    assert metrics["warm_start/tokens"] > 30 * 4 and 0 < metrics["warm_start/train_s"] <= \
        metrics["warm_start/seconds"]
    assert metrics["warm_start/flop_per_s"] == pytest.approx(
        metrics["warm_start/flop_per_token"] * metrics["warm_start/tokens"]
        / metrics["warm_start/train_s"])
    assert model.config.hidden_size == AutoModelForCausalLM.from_pretrained(
        tiny_model_dir).config.hidden_size
    assert AutoTokenizer.from_pretrained(tmp_path / "ws").chat_template == tokenizer.chat_template


def test_sft_computes_in_bf16_under_autocast_and_keeps_fp32_weights(tiny_model_dir, tokenizer,
                                                                    tmp_path):
    transcripts = oracle_transcripts("toolrl/Calculator-v0", ROWS, tokenizer)
    metrics = sft(tiny_model_dir, transcripts, tmp_path / "ws", steps=30, batch_size=4,
                  warmup_steps=5, compute_dtype="bfloat16", val_transcripts=transcripts[:4],
                  eval_every=15)
    assert metrics["warm_start/compute_dtype"] == "bfloat16"
    assert metrics["warm_start/loss_last"] < 0.5 * metrics["warm_start/loss_first"]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ws")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    auto = sft(tiny_model_dir, transcripts, tmp_path / "auto", steps=2, batch_size=2,
               compute_dtype="auto")  # timed on the model, then trained in what it chose
    assert auto["warm_start/compute_dtype"] in ("float32", "bfloat16")


def test_sft_stops_once_the_recent_mean_loss_is_low_enough(tiny_model_dir, tokenizer,
                                                            tmp_path):
    transcripts = oracle_transcripts("toolrl/Calculator-v0", ROWS, tokenizer)
    never = sft(tiny_model_dir, transcripts, tmp_path / "a", steps=12, batch_size=2,
                stop_loss=1e-9, stop_window=4)
    assert never["warm_start/steps"] == 12
    at_once = sft(tiny_model_dir, transcripts, tmp_path / "b", steps=12, batch_size=2,
                  stop_loss=1e9, stop_window=4)
    assert at_once["warm_start/steps"] == 4  # the first full window is already low enough
    assert (tmp_path / "b" / "config.json").exists()


def test_sft_stops_once_its_wall_time_budget_is_spent(tiny_model_dir, tokenizer, tmp_path):
    transcripts = oracle_transcripts("toolrl/Calculator-v0", ROWS, tokenizer)
    spent = sft(tiny_model_dir, transcripts, tmp_path / "a", steps=12, batch_size=2,
                seconds=0.0, val_transcripts=transcripts[:2], eval_every=5)
    assert spent["warm_start/steps"] == 1 and spent["warm_start/stopped"] == "seconds"
    assert [step for step, _ in spent["warm_start/val_curve"]] == [1]  # the last step scored
    assert (tmp_path / "a" / "config.json").exists()
    ample = sft(tiny_model_dir, transcripts, tmp_path / "b", steps=3, batch_size=2,
                seconds=3600.0)
    assert ample["warm_start/steps"] == 3 and ample["warm_start/stopped"] == "steps"


def test_the_trainer_warm_starts_from_config_and_reuses_the_result(tiny_model_dir, tmp_path):
    out = tmp_path / "ws"
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", [
        f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path / 'run'}",
        "warm_start.steps=3", "warm_start.num_transcripts=8", f"warm_start.output={out}",
        "warm_start.env_kwargs={oracle: random_op}"])
    trainer = Trainer(cfg)
    assert trainer.prepare_model() == str(out)
    metrics = json.loads((out / "warm_start_metrics.json").read_text())
    assert metrics["warm_start/steps"] == 3 and metrics["warm_start/transcripts"] == 8
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert Trainer(cfg).prepare_model() == str(out)  # reused, not retrained
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    assert metrics["base_model"] == str(tiny_model_dir)
    other = load_config(ROOT / "configs" / "quickstart.yaml", [
        f"model.path={tmp_path / 'other'}", "model.build_tiny_if_missing=true",
        f"trainer.output_dir={tmp_path / 'run'}", f"warm_start.output={out}"])
    with pytest.raises(ConfigError, match=r"warm start .*ws was trained from model\.path="
                       r".*and this config says model\.path=.*other.*warm_start\.output"):
        Trainer(other).prepare_model()  # another base model never reuses this warm start
    bad = load_config(ROOT / "configs" / "quickstart.yaml", [
        f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path / 'run2'}",
        f"warm_start.output={tmp_path / 'ws2'}", "warm_start.env_kwargs={oracle: psychic}"])
    with pytest.raises(ValueError, match="oracle"):
        Trainer(bad).prepare_model()


def test_a_batch_runs_its_common_prefix_once_with_the_plain_sft_loss(tokenizer, tiny_model_dir):
    """The SFT batch's prompt is the transcripts' longest common prefix (system prompt and
    tools), and its loss is exactly the plain padded cross-entropy on the action tokens."""
    transcripts = oracle_transcripts("toolrl/Calculator-v0", ROWS[:6], tokenizer)
    td = shared_prefix_batch(transcripts, pad_token_id=0)
    prefix = td["prompts"][0].tolist()
    assert (td["prompts"] == td["prompts"][0]).all()
    assert all(t.input_ids[:len(prefix)] == prefix for t in transcripts)
    assert len({t.input_ids[len(prefix)] for t in transcripts}) > 1  # the longest common one
    model = enable_scoring(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    with torch.no_grad():
        lp, _ = score_responses(model, td)
    mask = td["response_mask"].float()
    ours = -(lp * mask).sum() / mask.sum()
    width = max(len(t.input_ids) for t in transcripts)
    ids = torch.zeros(len(transcripts), width, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    attn = torch.zeros_like(ids)
    for i, t in enumerate(transcripts):
        n = len(t.input_ids)
        ids[i, :n] = torch.tensor(t.input_ids)
        attn[i, :n] = 1
        labels[i, :n] = torch.where(torch.tensor(t.loss_mask) == 1, ids[i, :n], -100)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    assert float(ours) == pytest.approx(float(plain), rel=1e-5)


def test_tau2_transcripts_start_after_the_agents_greeting(tokenizer):
    """tau2's conversation opens with the agent's greeting (part of the first prompt, never
    trained on); the actions trained on are the oracle's, each turn's own."""
    pytest.importorskip("tau2", reason="the tau2 extra is not installed")
    from toolrl.envs.tau2.reference import gold_script

    from toolrl import make_env

    env = make_env("toolrl/Tau2-v0", domain="mock")
    rows = env.unwrapped.make_tasks(0, split="all")
    transcripts = oracle_transcripts("toolrl/Tau2-v0", rows, tokenizer, {"domain": "mock"},
                                     max_len=4096)
    assert len(transcripts) == len(rows)
    greeted = 0
    for row, t in zip(rows, transcripts, strict=True):
        env.reset(options=row)
        task = env.unwrapped.task
        script = gold_script(task)
        expected = [s if isinstance(s, str) else env.unwrapped.render_calls(
            [ToolCall(name, args) for name, args in s]) for s in script]
        assert _actions(tokenizer, t) == expected
        if not (task.initial_state and task.initial_state.message_history):
            prompt = tokenizer.decode(t.input_ids[:t.loss_mask.index(1)])
            assert "Hi! How can I help you today?" in prompt  # the greeting: prompt, mask 0
            greeted += 1
    assert greeted >= len(rows) - 2


def test_sft_stops_by_patience_and_keeps_the_best_held_out_checkpoint(tiny_model_dir,
                                                                      tokenizer, tmp_path):
    """A learning rate this high overshoots after two steps: the held-out loss stops improving,
    the run ends by patience before the cap, and the checkpoint kept is the best one."""
    train = oracle_transcripts("toolrl/Calculator-v0", ROWS[:8], tokenizer)
    val = oracle_transcripts("toolrl/Calculator-v0", ROWS[8:12], tokenizer)
    metrics = sft(tiny_model_dir, train, tmp_path / "ws", steps=10, lr=0.05, batch_size=2,
                  warmup_steps=1, val_transcripts=val, eval_every=1, patience=2)
    curve = metrics["warm_start/val_curve"]
    assert metrics["warm_start/stopped"] == "patience" and metrics["warm_start/steps"] < 10
    assert [step for step, _ in curve] == list(range(1, len(curve) + 1))
    best = min(curve, key=lambda point: point[1])
    assert [metrics["warm_start/best_step"], metrics["warm_start/val_loss_best"]] == best
    assert len(curve) == best[0] + 2  # two evaluations without a new best
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ws")
    assert held_out_loss(model, val, 2, tokenizer.pad_token_id) == pytest.approx(best[1],
                                                                                rel=1e-6)
    assert curve[-1][1] != pytest.approx(best[1], rel=1e-3)  # not the last state
    assert not (tmp_path / "ws" / ".best").exists()
    assert (tmp_path / "ws" / "tokenizer_config.json").exists()


def test_evaluating_does_not_change_what_is_trained(tiny_model_dir, tokenizer, tmp_path):
    """Held-out evaluations consume no randomness and leave the model in training mode: a run
    evaluated at its last step only trains exactly the weights of a run without them."""
    train = oracle_transcripts("toolrl/Calculator-v0", ROWS[:4], tokenizer)
    val = oracle_transcripts("toolrl/Calculator-v0", ROWS[4:6], tokenizer)
    plain = sft(tiny_model_dir, train, tmp_path / "a", steps=2, batch_size=2, warmup_steps=1)
    assert plain["warm_start/stopped"] == "steps" and "warm_start/val_curve" not in plain
    held = sft(tiny_model_dir, train, tmp_path / "b", steps=2, batch_size=2, warmup_steps=1,
               val_transcripts=val, eval_every=2, patience=1)
    assert held["warm_start/loss_last"] == plain["warm_start/loss_last"]
    assert [step for step, _ in held["warm_start/val_curve"]] == [2]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == \
        (tmp_path / "b" / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="needs held-out transcripts"):
        sft(tiny_model_dir, train, tmp_path / "c", eval_every=2)
    with pytest.raises(ValueError, match="need eval_every >= 1"):
        sft(tiny_model_dir, train, tmp_path / "c", val_transcripts=val)


def test_hold_out_is_by_seed_and_disjoint(tokenizer):
    transcripts = oracle_transcripts("toolrl/Calculator-v0", ROWS[:8], tokenizer)
    train, val = hold_out(transcripts, 0.25, seed=1)
    assert len(train) == 6 and len(val) == 2
    assert sorted(map(id, train + val)) == sorted(map(id, transcripts))
    assert [t.input_ids for t in hold_out(transcripts, 0.25, seed=1)[1]] == \
        [t.input_ids for t in val]
    assert len(hold_out(transcripts, 0.01, seed=1)[1]) == 1  # at least one


@pytest.mark.parametrize("held_out", ["val_file", "val_fraction"])
def test_the_trainer_holds_out_transcripts_from_config(held_out, tiny_model_dir, tmp_path):
    out = tmp_path / "ws"
    rows = tmp_path / "val.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS[:3]))
    key = f"warm_start.val_file={rows}" if held_out == "val_file" else \
        "warm_start.val_fraction=0.25"
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", [
        f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path / 'run'}",
        "warm_start.steps=2", "warm_start.num_transcripts=8", "warm_start.batch_size=2",
        f"warm_start.output={out}", key, "warm_start.eval_every=1", "warm_start.patience=3"])
    assert Trainer(cfg).prepare_model() == str(out)
    metrics = json.loads((out / "warm_start_metrics.json").read_text())
    trained, val = (8, 3) if held_out == "val_file" else (6, 2)
    assert metrics["warm_start/transcripts"] == trained
    assert metrics["warm_start/val_transcripts"] == val
    assert metrics["warm_start/stopped"] == "steps"
    assert [step for step, _ in metrics["warm_start/val_curve"]] == [1, 2]
    assert metrics["warm_start/val_loss_best"] == min(
        loss for _, loss in metrics["warm_start/val_curve"])


@pytest.mark.parametrize("overrides,message", [
    (["warm_start.eval_every=5"], r"warm_start\.eval_every=5 evaluates the held-out loss: set "
                                  r"warm_start\.val_file or warm_start\.val_fraction"),
    (["warm_start.val_fraction=0.2"], r"set warm_start\.eval_every > 0"),
    (["warm_start.val_fraction=1.0", "warm_start.eval_every=1"],
     r"warm_start\.val_fraction must be in \[0, 1\), got 1\.0"),
    (["warm_start.val_fraction=-0.1", "warm_start.eval_every=1"],
     r"warm_start\.val_fraction must be in \[0, 1\), got -0\.1"),
    (["warm_start.val_fraction=0.2", "warm_start.val_file=v.jsonl", "warm_start.eval_every=1"],
     r"both hold out transcripts: set one of them"),
    (["warm_start.val_fraction=0.2", "warm_start.eval_every=1", "warm_start.patience=0"],
     r"warm_start\.patience >= 1, got 1 and 0"),
])
def test_held_out_keys_that_do_not_fit_are_one_line_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message) as exc:
        load_config(ROOT / "configs" / "quickstart.yaml", overrides)
    assert "\n" not in str(exc.value)


def test_a_missing_held_out_file_is_named_before_anything_runs(tmp_path):
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", [
        f"warm_start.val_file={tmp_path / 'none.jsonl'}", "warm_start.eval_every=1"])
    with pytest.raises(ConfigError, match=r"^warm_start\.val_file=.*none\.jsonl'?: the task "
                       r"file does not exist"):
        check_task_files(cfg)


def test_an_interrupted_warm_start_resumes_to_the_same_checkpoint(tiny_model_dir, tokenizer,
                                                                  tmp_path, monkeypatch):
    """Cut off after its 7th step (snapshots every 3) and started again with the same inputs,
    the warm start goes on from step 6 and ends with the weights, losses and held-out curve of
    the run that was never interrupted (issue 53)."""
    from safetensors.torch import load_file

    from toolrl.trainer import warm_start

    transcripts = oracle_transcripts("toolrl/Calculator-v0", ROWS, tokenizer)
    kwargs = dict(steps=10, batch_size=2, seed=3, val_transcripts=transcripts[:2],
                  eval_every=4, patience=5, save_every=3)
    whole = sft(tiny_model_dir, transcripts[2:], tmp_path / "whole", **kwargs)

    real, calls = warm_start.action_nll, {"n": 0}

    def cut_off(model, batch):
        if model.training:
            calls["n"] += 1
            if calls["n"] == 8:
                raise KeyboardInterrupt  # the machine went away inside step 8
        return real(model, batch)

    monkeypatch.setattr(warm_start, "action_nll", cut_off)
    with pytest.raises(KeyboardInterrupt):
        sft(tiny_model_dir, transcripts[2:], tmp_path / "cut", **kwargs)
    assert (tmp_path / "cut" / ".resume" / "state.pt").exists()
    monkeypatch.setattr(warm_start, "action_nll", real)
    resumed = sft(tiny_model_dir, transcripts[2:], tmp_path / "cut", **kwargs)
    assert not (tmp_path / "cut" / ".resume").exists()  # dropped once done
    for key in ("warm_start/steps", "warm_start/loss_first", "warm_start/loss_last",
                "warm_start/val_curve", "warm_start/best_step", "warm_start/val_loss_best",
                "warm_start/tokens", "warm_start/flop_per_token"):
        assert resumed[key] == whole[key], key
    a = load_file(tmp_path / "whole" / "model.safetensors")
    b = load_file(tmp_path / "cut" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_snapshot_of_another_warm_start_is_not_resumed(tiny_model_dir, tokenizer, tmp_path):
    transcripts = oracle_transcripts("toolrl/Calculator-v0", ROWS, tokenizer)
    sft(tiny_model_dir, transcripts, tmp_path / "a", steps=4, batch_size=2, save_every=2)
    state = tmp_path / "a" / ".resume" / "state.pt"
    assert not state.exists()  # a finished warm start leaves no snapshot
    # a snapshot left by a run with another seed: set aside, the run starts from step 0
    from toolrl.trainer.warm_start import _fingerprint, _Snapshot

    _Snapshot(state.parent, 2, _fingerprint(tiny_model_dir, transcripts, (), seed=99)).save(
        {"step": 2})
    out = sft(tiny_model_dir, transcripts, tmp_path / "a", steps=4, batch_size=2, save_every=2)
    assert out["warm_start/steps"] == 4
